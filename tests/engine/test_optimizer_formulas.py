"""Every optimizer of the engine, with its hyper-parameter variants, trained
for several steps (optimizer_training.py) and compared with the numpy
reference (spec §5.1-5.18) and, where TF has a CPU training kernel with the
same math (spec §5.20), with that kernel; lazy optimizers leave untouched
rows bit for bit, non-lazy ones move them.

Run with -s to see the maximum observed errors per case (ERRORS lines).
"""
import numpy as np
import pytest

import optimizer_reference as ref
from optimizer_reference import TableParams
from optimizer_training import (ID_RANGE, LAST_RUN, TABLES, compare_tables, run_training,
                                tf_comparable, zlib_seed)
from optimizer_training import _print_errors  # noqa: F401 (an autouse fixture)

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


# ========================================================= 1+2: every optimizer

def P(optimizer, **hp):
    return TableParams(optimizer, hp)


OPTIMIZER_CASES = {
    "sgd": P("stochastic_gradient_descent"),
    "adagrad": P("adagrad"),
}
for _nest in (False, True):
    for _beta2 in (1.0, 0.95):
        for _exp in (2.0, 4.0):
            _name = "adagrad_momentum-nesterov%d-beta2_%g-exp%g" % (_nest, _beta2, _exp)
            OPTIMIZER_CASES[_name] = P("adagrad_momentum", momentum=0.9, use_nesterov=_nest,
                                       beta2=_beta2, exponent=_exp, epsilon=1e-6)
OPTIMIZER_CASES.update({
    "bounded_adagrad-acc_first-bounded": P("bounded_adagrad", update_accumulator_first=True,
                                           max_var_update=0.05, max_accumulator=1.5),
    "bounded_adagrad-old_acc-unbounded": P("bounded_adagrad", update_accumulator_first=False),
    "bounded_adagrad-old_acc-bounded": P("bounded_adagrad", update_accumulator_first=False,
                                         max_var_update=0.08, max_accumulator=1.2),
})
for _lazy in (True, False):
    for _inside in (False, True):
        OPTIMIZER_CASES["adam-%s-%s" % ("lazy" if _lazy else "nonlazy",
                                        "sum_inside_sqrt" if _inside else "sqrt_plus_eps")] = \
            P("adam", beta1=0.9, beta2=0.99, epsilon=1e-3, use_non_lazy_adam=not _lazy,
              use_sum_inside_sqrt=_inside)
# with multiply_linear_by_lr the L1 threshold is lr * l1: l1 = 3 makes it 0.3
for _l, _power, _beta, _bylr in [((0.0, 0.0), -0.5, 0.0, False),
                                 ((0.3, 0.2), -0.5, 0.0, False),
                                 ((0.3, 0.2), -0.7, 0.0, False),
                                 ((3.0, 0.2), -0.5, 0.0, True),
                                 ((3.0, 0.2), -0.7, 0.0, True),
                                 ((0.3, 0.2), -0.5, 0.5, False),
                                 ((3.0, 0.2), -0.7, 0.5, True)]:
    OPTIMIZER_CASES["ftrl-l1_%g-l2_%g-power%g-beta%g-by_lr%d" % (_l + (_power, _beta, _bylr))] = \
        P("ftrl", l1=_l[0], l2=_l[1], lr_power=_power, beta=_beta, multiply_linear_by_lr=_bylr)
OPTIMIZER_CASES.update({
    "momentum": P("momentum", momentum=0.9),
    "momentum-nesterov": P("momentum", momentum=0.9, use_nesterov=True),
    "rms_prop": P("rms_prop", rho=0.9, momentum=0.5, epsilon=1e-3),
    "centered_rms_prop": P("centered_rms_prop", rho=0.9, momentum=0.5, epsilon=1e-3),
    "proximal_adagrad-l1_0": P("proximal_adagrad", l1=0.0, l2=0.1),
    "proximal_adagrad-l1_0.05": P("proximal_adagrad", l1=0.05, l2=0.1),
    "adadelta": P("adadelta", rho=0.9, epsilon=1e-3),
    "proximal_yogi": P("proximal_yogi", l1=0.05, l2=0.1, beta1=0.9, beta2=0.99, epsilon=1e-3),
    "online_yogi": P("online_yogi", l1=0.3, l2=0.2, beta2=0.99),
    "lion-lazy": P("lion", beta1=0.9, beta2=0.99),
    "lion-nonlazy": P("lion", beta1=0.9, beta2=0.99, use_non_lazy_lion=True),
    # the "learning rate" is the global step (dynamic tag 0, both tables)
    "frequency_estimator": TableParams("frequency_estimator",
                                       dict(tau=0.3, max_delta=5.0, outlier_threshold=2.0,
                                            weight_exponent=1.0), lr_tag=0),
    # constant lr, step_counter = dynamic tag 0
    "frequency_aware_adagrad": TableParams(
        "frequency_aware_adagrad",
        dict(l1_regularization_strength=0.01, l2_regularization_strength=0.02,
             probability_exponent=0.5, max_lr_multiplier=3.0, accumulator_decay=0.9,
             initial_accumulator_value=0.1), step_counter_tag=0),
    "assign": P("assign"),
})
DYNAMIC = {
    "frequency_estimator": lambda s: [6.0, 7.0, 9.0][s],
    "frequency_aware_adagrad": lambda s: [3.0, 4.0, 6.0][s],
}


@pytest.mark.parametrize("case", list(OPTIMIZER_CASES))
def test_optimizer_matches_reference(case):
    p = OPTIMIZER_CASES[case]
    dyn = DYNAMIC.get(p.optimizer)
    use_tf = tf_comparable(p)
    got, want, tfs = run_training([p, p], dynamic=(lambda s: [dyn(s)]) if dyn else (lambda s: []),
                                  seed=zlib_seed(case), use_tf=use_tf, label=case)
    compare_tables(got, want, case + " vs numpy")
    if use_tf:
        compare_tables(got, tfs, case + " vs TF kernel")
    init = LAST_RUN["init"]
    for t in range(len(TABLES)):
        touched, untouched = slice(0, ID_RANGE[t]), slice(ID_RANGE[t], None)
        # the steps moved the parameters of the rows they touched ...
        assert not np.allclose(got[t][0][touched], init[t][0][touched]), case
        if ref.is_non_lazy(p.optimizer, p.hp):  # ... and, non-lazy, all others
            assert not np.allclose(got[t][0][untouched], init[t][0][untouched]), case
        else:  # lazy: rows no id referenced keep parameters and slots bit for bit
            for k in range(len(got[t])):
                np.testing.assert_array_equal(got[t][k][untouched], init[t][k][untouched])
    if p.optimizer == "ftrl" and p.hp["l1"] > 0:
        # the L1 branch is exercised: some touched weights are exactly 0, some not
        w = got[0][0][:ID_RANGE[0]]
        assert 0 < np.count_nonzero(w == 0) < w.size, case
