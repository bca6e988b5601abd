"""The single optimizer source (tf_tpu_emb/optimizer_specs.py) and what it
generates: the checked-in C++ headers are current, the typed hyper-parameters
match the proto, and the engine's slots start where the spec says."""
import os
import sys

import numpy as np
import pytest
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

import engine_util as eu
from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb import optimizer_specs as S
import harness  # tests/common: the one way to start a child process

ROOT = harness.ROOT
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_optimizers  # noqa: E402

Params = optimization_parameters_pb2.OptimizationParameters
ALL = S.OPTIMIZERS + S.REFUSED
_FD = Params.DESCRIPTOR.fields_by_name["adagrad"]
_KIND_OF_TYPE = {_FD.TYPE_FLOAT: S.FLOAT, _FD.TYPE_BOOL: S.BOOL, _FD.TYPE_MESSAGE: S.DYNAMIC}


@pytest.mark.parametrize("rel", sorted(gen_optimizers.generate()))
def test_generated_header_is_current(rel):
    """Regenerates the header from the spec and diffs it with the checked-in one."""
    want = gen_optimizers.generate()[rel]
    with open(os.path.join(ROOT, rel)) as f:
        got = f.read()
    assert got == want, ("%s is stale: run python tools/gen_optimizers.py" % rel)


@pytest.mark.system
def test_check_mode_reports_current_tree():
    """The script's --check mode (what CI can call) agrees with the diff above."""
    r = harness.run_python([os.path.join(ROOT, "tools", "gen_optimizers.py"), "--check"],
                           timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_mode_detects_a_stale_header(tmp_path, monkeypatch):
    """A header that differs from the spec's output is reported, not rewritten."""
    monkeypatch.setattr(gen_optimizers, "ROOT", str(tmp_path))
    (tmp_path / "core").mkdir()
    for rel, text in gen_optimizers.generate().items():
        (tmp_path / rel).write_text(text)
    stale = tmp_path / gen_optimizers.TABLE_H
    stale.write_text(stale.read_text().replace('"adagrad"', '"adagrad2"'))
    assert gen_optimizers.main(["--check"]) == 1
    assert '"adagrad2"' in stale.read_text()
    assert gen_optimizers.main([]) == 0
    assert '"adagrad2"' not in stale.read_text()


@pytest.mark.parametrize("info", ALL, ids=lambda o: o.proto_field)
def test_hyper_kinds_match_proto(info):
    msg = Params.DESCRIPTOR.fields_by_name[info.proto_field].message_type
    for h in info.hypers:
        if h.field is None:
            assert h.kind == S.FLOAT, h  # Python-only: a slot's initial value
            continue
        fd = msg.fields_by_name.get(h.field)
        assert fd is not None, "%s has no field %r" % (msg.full_name, h.field)
        assert _KIND_OF_TYPE[fd.type] == h.kind, (info.proto_field, h.field)
        if h.kind == S.DYNAMIC:
            assert fd.message_type.name == "OptimizerDynamicInput", h.field
    if info.non_lazy_field is not None:
        assert msg.fields_by_name[info.non_lazy_field].type == _FD.TYPE_BOOL
        assert info.non_lazy_field in {h.field for h in info.hypers}


def test_op_names_come_from_the_spec():
    """The Python op wrappers are the spec's ops; REFUSED entries have none."""
    for info in S.OPTIMIZERS:
        handles = tte_ops.table_ops(info.proto_field)
        assert handles.info is info
        assert handles.tensors == ("parameters",) + tuple(info.slots)
        assert handles.load.__name__ == tte_ops._snake(info.load_op)
        assert handles.retrieve.__name__ == tte_ops._snake(info.retrieve_op)
    for info in S.REFUSED:
        with pytest.raises(ValueError, match=info.proto_field):
            tte_ops.table_ops(info.proto_field)


def _expected_slot_init(info, params):
    out = []
    for v in info.slot_init:
        if not isinstance(v, str):
            out.append(v)
        elif info.hyper(v).field is None:
            out.append(info.hyper(v).default)
        else:
            out.append(getattr(getattr(params, info.proto_field), info.hyper(v).field))
    return out


@pytest.mark.parametrize("info", [o for o in S.OPTIMIZERS if o.implemented and o.slots],
                         ids=lambda o: o.proto_field)
def test_engine_slots_start_at_spec_values(lib, info):
    """Configure, then Retrieve before any Load: each slot holds the initial
    value the spec gives (a constant, a proto field, or an argument's default)."""
    config = eu.table_mode_config([eu.TableSpec("t", 5, 2, optimizer=info.proto_field,
                                                num_features=1)], 4)
    params = config.table_descriptor[0].optimization_parameters
    if info.proto_field == "frequency_aware_adagrad":
        params.frequency_aware_adagrad.initial_accumulator_value = 0.375
    want = _expected_slot_init(info, params)
    with eu.engine(config):
        got = eu.retrieve_table(config.table_descriptor[0])
    assert len(got) == 1 + len(info.slots)
    for name, value, array in zip(info.slots, want, got[1:]):
        np.testing.assert_array_equal(array, np.full((5, 2), value, np.float32), err_msg=name)
