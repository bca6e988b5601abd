/* A C client of tf_tpu_emb through TensorFlow's C API only -- the way C,
 * TF-Java and Go programs use the plugin.  It needs nothing but the plugin's
 * path: it writes its own TPUEmbeddingConfiguration (serialized by hand,
 * below), makes its own data, and trains STEPS Adagrad steps:
 *
 *   TF_LoadLibrary(plugin) -> ConfigureTPUEmbedding -> LoadTPUEmbedding...
 *   per step: EnqueueTPUEmbeddingArbitraryTensorBatch (ids fed as
 *   placeholders) -> RecvTPUEmbeddingActivations -> TPUEmbeddingActivations
 *   -> loss -> TF_AddGradients (the activation gradient) ->
 *   SendTPUEmbeddingGradients (the engine runs Adagrad on the table)
 *   -> RetrieveTPUEmbeddingAdagradParameters.
 *
 * usage: train PLUGIN [PREFIX]
 *   PLUGIN: the plugin's path (`python -c 'import tf_tpu_emb;
 *           print(tf_tpu_emb.library_path())'`).
 *   PREFIX: "" (default) builds the ops by TF's core names
 *           (RecvTPUEmbeddingActivations, ...); "TfTpuEmb>" by the plugin's.
 *
 * The model (README "C, Java and Go clients"; tests/c_api/test_c_api.py checks
 * every printed number against numpy): one table "video" of VOCAB x DIM,
 * Adagrad (learning rate LR, accumulators start at 0.1), one feature, BATCH
 * bags per step, combiner "mean" with weights.  Row r, column c starts at
 * 0.01 * (r * DIM + c) - 0.3.  Every step feeds the same bags (so the loss
 * falls): bag b holds b ids (bag 0 is empty), id k = (5 b + 3 k) % VOCAB with
 * weight 1 + 0.5 k; the loss is sum((activation - target)^2) with
 * target[b][c] = (b + c) % 3 - 1.
 * It prints "step S loss L" per step, then the table and its accumulators. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorflow/c/c_api.h"

enum { VOCAB = 16, DIM = 4, BATCH = 4, STEPS = 5, MAX_IDS = BATCH * 3 };
static const float LR = 0.1f;

static TF_Status* status;
static TF_Graph* graph;
static char prefix[64];

static void check(const char* what) {
  if (TF_GetCode(status) != TF_OK) {
    fprintf(stderr, "%s: %s\n", what, TF_Message(status));
    exit(1);
  }
}

/* ---- the config: a few protobuf fields, written by hand ---------------- */

typedef struct {
  unsigned char data[256];
  size_t n;
} Buffer;

static void put_varint(Buffer* b, unsigned long long v) {
  do {
    unsigned char byte = v & 0x7f;
    v >>= 7;
    b->data[b->n++] = byte | (v ? 0x80 : 0);
  } while (v);
}

static void put_int(Buffer* b, int field, unsigned long long v) {
  put_varint(b, (unsigned long long)field << 3); /* wire type 0: varint */
  put_varint(b, v);
}

static void put_bytes(Buffer* b, int field, const void* data, size_t n) {
  put_varint(b, ((unsigned long long)field << 3) | 2); /* wire type 2: length-delimited */
  put_varint(b, n);
  memcpy(b->data + b->n, data, n);
  b->n += n;
}

static void put_float(Buffer* b, int field, float f) {
  put_varint(b, ((unsigned long long)field << 3) | 5); /* wire type 5: 32-bit */
  memcpy(b->data + b->n, &f, 4);                       /* little-endian hosts (x86-64, arm64) */
  b->n += 4;
}

/* TPUEmbeddingConfiguration, field numbers as TF's
 * tensorflow/core/protobuf/tpu/tpu_embedding_configuration.proto and
 * optimization_parameters.proto define them: one table in table mode
 * (docs/tpu_embedding_semantics.md), TRAINING. */
static Buffer make_config(void) {
  Buffer rate = {{0}, 0}, adagrad = {{0}, 0}, optimizer = {{0}, 0}, table = {{0}, 0};
  Buffer config = {{0}, 0};
  put_float(&rate, 1, LR);                           /* LearningRate.constant */
  put_bytes(&optimizer, 13, rate.data, rate.n);      /* .learning_rate */
  put_bytes(&optimizer, 3, adagrad.data, adagrad.n); /* .adagrad {} */
  put_bytes(&table, 1, "video", 5);                  /* TableDescriptor.name */
  put_int(&table, 2, VOCAB);                         /* .vocabulary_size */
  put_int(&table, 3, DIM);                           /* .dimension */
  put_int(&table, 4, 1);                             /* .num_features */
  put_bytes(&table, 5, optimizer.data, optimizer.n); /* .optimization_parameters */
  put_bytes(&config, 1, table.data, table.n);        /* .table_descriptor */
  put_int(&config, 2, 2);                            /* .mode = TRAINING */
  put_int(&config, 3, BATCH);                        /* .batch_size_per_tensor_core */
  put_int(&config, 4, 1);                            /* .num_hosts */
  put_int(&config, 5, 1);                            /* .num_tensor_cores */
  return config;
}

/* ---- graph building ---------------------------------------------------- */

/* A new operation of the plugin under the chosen naming. */
static TF_OperationDescription* new_op(const char* type, const char* name) {
  char full[256];
  snprintf(full, sizeof full, "%s%s", prefix, type);
  return TF_NewOperation(graph, full, name);
}

static TF_Operation* finish(TF_OperationDescription* d, const char* what) {
  TF_Operation* op = TF_FinishOperation(d, status);
  check(what);
  return op;
}

static TF_Tensor* tensor(TF_DataType dt, const int64_t* dims, int rank, const void* data,
                         size_t elem) {
  size_t n = 1;
  for (int i = 0; i < rank; ++i) n *= (size_t)dims[i];
  TF_Tensor* t = TF_AllocateTensor(dt, dims, rank, n * elem);
  if (n) memcpy(TF_TensorData(t), data, n * elem);
  return t;
}

static TF_Output constant(const char* name, TF_Tensor* value) {
  TF_OperationDescription* d = TF_NewOperation(graph, "Const", name);
  TF_SetAttrTensor(d, "value", value, status);
  check(name);
  TF_SetAttrType(d, "dtype", TF_TensorType(value));
  TF_Output out = {finish(d, name), 0};
  TF_DeleteTensor(value);
  return out;
}

static TF_Output placeholder(const char* name, TF_DataType dt) {
  TF_OperationDescription* d = TF_NewOperation(graph, "Placeholder", name);
  TF_SetAttrType(d, "dtype", dt);
  TF_Output out = {finish(d, name), 0};
  return out;
}

static TF_Output binary(const char* type, const char* name, TF_Output a, TF_Output b) {
  TF_OperationDescription* d = TF_NewOperation(graph, type, name);
  TF_AddInput(d, a);
  TF_AddInput(d, b);
  TF_Output out = {finish(d, type), 0};
  return out;
}

static void run(TF_Session* s, const TF_Output* inputs, TF_Tensor* const* input_values, int ninputs,
                const TF_Output* fetch, TF_Tensor** values, int nfetch, const TF_Operation* target,
                const char* what) {
  TF_SessionRun(s, NULL, inputs, input_values, ninputs, fetch, values, nfetch,
                target ? &target : NULL, target ? 1 : 0, NULL, status);
  check(what);
}

static void print_floats(const char* label, TF_Tensor* t) {
  const float* v = (const float*)TF_TensorData(t);
  size_t n = TF_TensorByteSize(t) / sizeof(float);
  printf("%s", label);
  for (size_t i = 0; i < n; ++i) printf(" %.9g", v[i]);
  printf("\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s PLUGIN [PREFIX]\n", argv[0]);
    return 2;
  }
  snprintf(prefix, sizeof prefix, "%s", argc == 3 ? argv[2] : "");
  status = TF_NewStatus();
  TF_Library* lib = TF_LoadLibrary(argv[1], status);
  check("TF_LoadLibrary");
  Buffer config = make_config();
  graph = TF_NewGraph();
  TF_OperationDescription* d;

  d = new_op("ConfigureTPUEmbedding", "configure");
  TF_SetAttrString(d, "config", config.data, config.n);
  TF_Operation* configure = finish(d, "ConfigureTPUEmbedding");

  float table[VOCAB * DIM], accumulators[VOCAB * DIM];
  for (int i = 0; i < VOCAB * DIM; ++i) {
    table[i] = 0.01f * i - 0.3f;
    accumulators[i] = 0.1f;
  }
  const int64_t table_dims[2] = {VOCAB, DIM};
  d = new_op("LoadTPUEmbeddingAdagradParameters", "load");
  TF_AddInput(d, constant("parameters", tensor(TF_FLOAT, table_dims, 2, table, 4)));
  TF_AddInput(d, constant("accumulators", tensor(TF_FLOAT, table_dims, 2, accumulators, 4)));
  TF_SetAttrString(d, "table_name", "video", 5);
  TF_SetAttrInt(d, "num_shards", 1);
  TF_SetAttrInt(d, "shard_id", 0);
  TF_Operation* load = finish(d, "LoadTPUEmbeddingAdagradParameters");

  /* Enqueue: one step's bags as row splits, ids and weights, fed per step. */
  TF_Output splits = placeholder("splits", TF_INT32);
  TF_Output ids = placeholder("ids", TF_INT64);
  TF_Output weights = placeholder("weights", TF_FLOAT);
  TF_Output mode;
  {
    TF_TString s;
    TF_TString_Init(&s);
    TF_TString_Copy(&s, "unspecified", 11); /* the config's mode: TRAINING */
    TF_Tensor* t = TF_AllocateTensor(TF_STRING, NULL, 0, sizeof(TF_TString));
    memcpy(TF_TensorData(t), &s, sizeof s);
    mode = constant("mode", t);
  }
  d = new_op("EnqueueTPUEmbeddingArbitraryTensorBatch", "enqueue");
  TF_AddInputList(d, &splits, 1);
  TF_AddInputList(d, &ids, 1);
  TF_AddInputList(d, &weights, 1);
  TF_AddInput(d, mode);
  const char* combiners[1] = {"mean"};
  const size_t combiner_lens[1] = {4};
  TF_SetAttrStringList(d, "combiners", (const void* const*)combiners, combiner_lens, 1);
  TF_Operation* enqueue = finish(d, "EnqueueTPUEmbeddingArbitraryTensorBatch");

  /* The step: Recv -> TPUEmbeddingActivations -> loss -> gradient -> Send. */
  d = new_op("RecvTPUEmbeddingActivations", "recv");
  TF_SetAttrInt(d, "num_outputs", 1);
  TF_SetAttrString(d, "config", config.data, config.n);
  TF_Output recv = {finish(d, "RecvTPUEmbeddingActivations"), 0};
  /* The lookup's embedding_variable may be any float tensor: the gradient
   * with respect to it is the activations' gradient. */
  const float zero = 0;
  const int64_t one[1] = {1};
  TF_Output embedding_variable = constant("embedding_variable", tensor(TF_FLOAT, one, 1, &zero, 4));
  d = new_op("TPUEmbeddingActivations", "activations");
  TF_AddInput(d, embedding_variable);
  TF_AddInput(d, recv);
  TF_SetAttrInt(d, "table_id", 0);
  TF_SetAttrInt(d, "lookup_id", 0);
  TF_Output activations = {finish(d, "TPUEmbeddingActivations"), 0};

  float target[BATCH * DIM];
  for (int b = 0; b < BATCH; ++b)
    for (int c = 0; c < DIM; ++c) target[b * DIM + c] = (float)((b + c) % 3 - 1);
  const int64_t act_dims[2] = {BATCH, DIM};
  TF_Output diff = binary("Sub", "diff", activations,
                          constant("target", tensor(TF_FLOAT, act_dims, 2, target, 4)));
  TF_Output square = binary("Mul", "square", diff, diff);
  const int32_t axes[2] = {0, 1};
  const int64_t axes_dims[1] = {2};
  TF_Output loss =
      binary("Sum", "loss", square, constant("axes", tensor(TF_INT32, axes_dims, 1, axes, 4)));
  TF_Output gradient;
  TF_AddGradients(graph, &loss, 1, &embedding_variable, 1, NULL, status, &gradient);
  check("TF_AddGradients");
  d = new_op("SendTPUEmbeddingGradients", "send");
  TF_AddInputList(d, &gradient, 1);
  TF_AddInputList(d, NULL, 0); /* no dynamic learning rates */
  TF_SetAttrString(d, "config", config.data, config.n);
  TF_Operation* send = finish(d, "SendTPUEmbeddingGradients");

  d = new_op("RetrieveTPUEmbeddingAdagradParameters", "retrieve");
  TF_SetAttrString(d, "table_name", "video", 5);
  TF_SetAttrInt(d, "num_shards", 1);
  TF_SetAttrInt(d, "shard_id", 0);
  TF_Operation* retrieve = finish(d, "RetrieveTPUEmbeddingAdagradParameters");
  /* The plugin's own op (TF has no shutdown op of this form). */
  d = TF_NewOperation(graph, "TfTpuEmb>ShutdownTPUEmbedding", "shutdown");
  TF_Operation* shutdown = finish(d, "ShutdownTPUEmbedding");

  TF_SessionOptions* options = TF_NewSessionOptions();
  TF_Session* session = TF_NewSession(graph, options, status);
  check("TF_NewSession");
  run(session, NULL, NULL, 0, NULL, NULL, 0, configure, "configure");
  run(session, NULL, NULL, 0, NULL, NULL, 0, load, "load");

  for (int step = 0; step < STEPS; ++step) {
    int32_t row_splits[BATCH + 1];
    int64_t step_ids[MAX_IDS];
    float step_weights[MAX_IDS];
    int n = 0;
    row_splits[0] = 0;
    for (int b = 0; b < BATCH; ++b) {
      for (int k = 0; k < b; ++k, ++n) {
        step_ids[n] = (5 * b + 3 * k) % VOCAB;
        step_weights[n] = 1.0f + 0.5f * k;
      }
      row_splits[b + 1] = n;
    }
    const int64_t splits_dims[1] = {BATCH + 1}, ids_dims[1] = {n};
    TF_Output feeds[3] = {splits, ids, weights};
    TF_Tensor* values[3] = {tensor(TF_INT32, splits_dims, 1, row_splits, 4),
                            tensor(TF_INT64, ids_dims, 1, step_ids, 8),
                            tensor(TF_FLOAT, ids_dims, 1, step_weights, 4)};
    run(session, feeds, values, 3, NULL, NULL, 0, enqueue, "enqueue");
    for (int i = 0; i < 3; ++i) TF_DeleteTensor(values[i]);
    TF_Tensor* loss_value;
    run(session, NULL, NULL, 0, &loss, &loss_value, 1, send, "training step");
    printf("step %d loss %.9g\n", step, *(const float*)TF_TensorData(loss_value));
    TF_DeleteTensor(loss_value);
  }

  TF_Output state[2] = {{retrieve, 0}, {retrieve, 1}};
  TF_Tensor* state_values[2];
  run(session, NULL, NULL, 0, state, state_values, 2, NULL, "retrieve");
  run(session, NULL, NULL, 0, NULL, NULL, 0, shutdown, "shutdown");
  print_floats("parameters", state_values[0]);
  print_floats("accumulators", state_values[1]);

  for (int i = 0; i < 2; ++i) TF_DeleteTensor(state_values[i]);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteLibraryHandle(lib);
  TF_DeleteStatus(status);
  return 0;
}
