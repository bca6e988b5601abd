/* A C client of the plugin through TensorFlow's C API only, the way TF-Java
 * and Go use it: TF_LoadLibrary, then one Adagrad training step built by op
 * name -- Configure, Load, Enqueue, Recv, TPUEmbeddingActivations, a loss,
 * TF_AddGradients (the activation gradient), Send, Retrieve -- and the values
 * printed for test_c_api.py to compare with numpy.
 *
 * usage: train_step PLUGIN PREFIX CONFIG_FILE DATA_FILE
 *   PREFIX: "" for TF's core op names, "TfTpuEmb>" for the plugin's names.
 *   CONFIG_FILE: a serialized TPUEmbeddingConfiguration (one Adagrad table,
 *   one feature, table mode).
 *   DATA_FILE (text): vocab dim batch nids, then the table (vocab*dim), its
 *   accumulators (vocab*dim), row splits (batch+1), ids (nids), weights
 *   (nids) and the loss target (batch*dim).
 * loss = sum((activations - target)^2), combiner "mean". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorflow/c/c_api.h"

static TF_Status* status;
static TF_Graph* graph;
static char prefix[64];

static void check(const char* what) {
  if (TF_GetCode(status) != TF_OK) {
    fprintf(stderr, "%s: %s\n", what, TF_Message(status));
    exit(1);
  }
}

static void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) exit(2);
  return p;
}

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

static void read_floats(FILE* f, float* v, long n) {
  for (long i = 0; i < n; ++i)
    if (fscanf(f, "%f", &v[i]) != 1) { fprintf(stderr, "bad data file\n"); exit(2); }
}

static void read_ints(FILE* f, void* v, long n, int wide) {
  for (long i = 0; i < n; ++i) {
    long long x;
    if (fscanf(f, "%lld", &x) != 1) { fprintf(stderr, "bad data file\n"); exit(2); }
    if (wide) ((int64_t*)v)[i] = x; else ((int32_t*)v)[i] = (int32_t)x;
  }
}

static void print_tensor(const char* label, TF_Tensor* t) {
  const float* v = (const float*)TF_TensorData(t);
  size_t n = TF_TensorByteSize(t) / sizeof(float);
  printf("%s", label);
  for (size_t i = 0; i < n; ++i) printf(" %.9g", v[i]);
  printf("\n");
}

static void run(TF_Session* s, const TF_Output* fetch, int nfetch, TF_Tensor** values,
                const TF_Operation* const* targets, int ntargets, const char* what) {
  TF_SessionRun(s, NULL, NULL, NULL, 0, fetch, values, nfetch, targets, ntargets, NULL, status);
  check(what);
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s PLUGIN PREFIX CONFIG_FILE DATA_FILE\n", argv[0]);
    return 2;
  }
  snprintf(prefix, sizeof prefix, "%s", argv[2]);
  status = TF_NewStatus();
  TF_Library* lib = TF_LoadLibrary(argv[1], status);
  check("TF_LoadLibrary");

  FILE* cf = fopen(argv[3], "rb");
  if (!cf) { perror(argv[3]); return 2; }
  char* config = xmalloc(1 << 20);
  size_t config_len = fread(config, 1, 1 << 20, cf);
  fclose(cf);

  FILE* df = fopen(argv[4], "r");
  if (!df) { perror(argv[4]); return 2; }
  long vocab, dim, batch, nids;
  if (fscanf(df, "%ld %ld %ld %ld", &vocab, &dim, &batch, &nids) != 4) return 2;
  float* table = xmalloc(sizeof(float) * vocab * dim);
  float* accum = xmalloc(sizeof(float) * vocab * dim);
  int32_t* splits = xmalloc(sizeof(int32_t) * (batch + 1));
  int64_t* ids = xmalloc(sizeof(int64_t) * nids);
  float* weights = xmalloc(sizeof(float) * nids);
  float* target = xmalloc(sizeof(float) * batch * dim);
  read_floats(df, table, vocab * dim);
  read_floats(df, accum, vocab * dim);
  read_ints(df, splits, batch + 1, 0);
  read_ints(df, ids, nids, 1);
  read_floats(df, weights, nids);
  read_floats(df, target, batch * dim);
  fclose(df);

  graph = TF_NewGraph();
  TF_OperationDescription* d;

  d = new_op("ConfigureTPUEmbedding", "configure");
  TF_SetAttrString(d, "config", config, config_len);
  TF_Operation* configure = finish(d, "ConfigureTPUEmbedding");

  const int64_t table_dims[2] = {vocab, dim};
  TF_Output params = constant("params", tensor(TF_FLOAT, table_dims, 2, table, 4));
  TF_Output accums = constant("accums", tensor(TF_FLOAT, table_dims, 2, accum, 4));
  d = new_op("LoadTPUEmbeddingAdagradParameters", "load");
  TF_AddInput(d, params);
  TF_AddInput(d, accums);
  TF_SetAttrString(d, "table_name", "t0", 2);
  TF_SetAttrInt(d, "num_shards", 1);
  TF_SetAttrInt(d, "shard_id", 0);
  TF_Operation* load = finish(d, "LoadTPUEmbeddingAdagradParameters");

  const int64_t splits_dims[1] = {batch + 1}, ids_dims[1] = {nids};
  TF_Output splits_in = constant("splits", tensor(TF_INT32, splits_dims, 1, splits, 4));
  TF_Output ids_in = constant("ids", tensor(TF_INT64, ids_dims, 1, ids, 8));
  TF_Output weights_in = constant("weights", tensor(TF_FLOAT, ids_dims, 1, weights, 4));
  TF_Output mode = {0};
  {
    TF_TString s;
    TF_TString_Init(&s);
    TF_TString_Copy(&s, "unspecified", 11);
    TF_Tensor* t = TF_AllocateTensor(TF_STRING, NULL, 0, sizeof(TF_TString));
    memcpy(TF_TensorData(t), &s, sizeof s);
    mode = constant("mode", t);
  }
  d = new_op("EnqueueTPUEmbeddingArbitraryTensorBatch", "enqueue");
  TF_AddInputList(d, &splits_in, 1);
  TF_AddInputList(d, &ids_in, 1);
  TF_AddInputList(d, &weights_in, 1);
  TF_AddInput(d, mode);
  const char* combiners[1] = {"mean"};
  const size_t combiner_lens[1] = {4};
  TF_SetAttrStringList(d, "combiners", (const void* const*)combiners, combiner_lens, 1);
  TF_Operation* enqueue = finish(d, "EnqueueTPUEmbeddingArbitraryTensorBatch");

  d = new_op("RecvTPUEmbeddingActivations", "recv");
  TF_SetAttrInt(d, "num_outputs", 1);
  TF_SetAttrString(d, "config", config, config_len);
  TF_Output recv = {finish(d, "RecvTPUEmbeddingActivations"), 0};

  /* The lookup's embedding_variable: any float tensor; the gradient with
   * respect to it is the activations' gradient. */
  const float zero = 0;
  const int64_t one[1] = {1};
  TF_Output embedding_variable = constant("embedding_variable",
                                          tensor(TF_FLOAT, one, 1, &zero, 4));
  d = new_op("TPUEmbeddingActivations", "activations");
  TF_AddInput(d, embedding_variable);
  TF_AddInput(d, recv);
  TF_SetAttrInt(d, "table_id", 0);
  TF_SetAttrInt(d, "lookup_id", 0);
  TF_Output act = {finish(d, "TPUEmbeddingActivations"), 0};

  const int64_t act_dims[2] = {batch, dim};
  TF_Output target_in = constant("target", tensor(TF_FLOAT, act_dims, 2, target, 4));
  d = TF_NewOperation(graph, "Sub", "diff");
  TF_AddInput(d, act);
  TF_AddInput(d, target_in);
  TF_Output diff = {finish(d, "Sub"), 0};
  d = TF_NewOperation(graph, "Square", "square");
  TF_AddInput(d, diff);
  TF_Output square = {finish(d, "Square"), 0};
  const int32_t axes[2] = {0, 1};
  const int64_t axes_dims[1] = {2};
  TF_Output axes_in = constant("axes", tensor(TF_INT32, axes_dims, 1, axes, 4));
  d = TF_NewOperation(graph, "Sum", "loss");
  TF_AddInput(d, square);
  TF_AddInput(d, axes_in);
  TF_Output loss = {finish(d, "Sum"), 0};

  TF_Output grad;
  TF_AddGradients(graph, &loss, 1, &embedding_variable, 1, NULL, status, &grad);
  check("TF_AddGradients");

  d = new_op("SendTPUEmbeddingGradients", "send");
  TF_AddInputList(d, &grad, 1);
  TF_AddInputList(d, NULL, 0);
  TF_SetAttrString(d, "config", config, config_len);
  TF_Operation* send = finish(d, "SendTPUEmbeddingGradients");

  d = new_op("RetrieveTPUEmbeddingAdagradParameters", "retrieve");
  TF_SetAttrString(d, "table_name", "t0", 2);
  TF_SetAttrInt(d, "num_shards", 1);
  TF_SetAttrInt(d, "shard_id", 0);
  TF_Operation* retrieve = finish(d, "RetrieveTPUEmbeddingAdagradParameters");

  d = TF_NewOperation(graph, "TfTpuEmb>ShutdownTPUEmbedding", "shutdown");
  TF_Operation* shutdown = finish(d, "ShutdownTPUEmbedding");

  TF_SessionOptions* options = TF_NewSessionOptions();
  TF_Session* session = TF_NewSession(graph, options, status);
  check("TF_NewSession");

  run(session, NULL, 0, NULL, (const TF_Operation* const*)&configure, 1, "configure");
  run(session, NULL, 0, NULL, (const TF_Operation* const*)&load, 1, "load");
  run(session, NULL, 0, NULL, (const TF_Operation* const*)&enqueue, 1, "enqueue");
  TF_Output step_fetch[3] = {act, loss, grad};
  TF_Tensor* step_values[3];
  run(session, step_fetch, 3, step_values, (const TF_Operation* const*)&send, 1, "step");
  TF_Output state_fetch[2] = {{retrieve, 0}, {retrieve, 1}};
  TF_Tensor* state_values[2];
  run(session, state_fetch, 2, state_values, NULL, 0, "retrieve");
  run(session, NULL, 0, NULL, (const TF_Operation* const*)&shutdown, 1, "shutdown");

  print_tensor("activations", step_values[0]);
  print_tensor("loss", step_values[1]);
  print_tensor("gradient", step_values[2]);
  print_tensor("parameters", state_values[0]);
  print_tensor("accumulators", state_values[1]);

  for (int i = 0; i < 3; ++i) TF_DeleteTensor(step_values[i]);
  for (int i = 0; i < 2; ++i) TF_DeleteTensor(state_values[i]);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteLibraryHandle(lib);
  TF_DeleteStatus(status);
  free(config);
  free(table); free(accum); free(splits); free(ids); free(weights); free(target);
  return 0;
}
