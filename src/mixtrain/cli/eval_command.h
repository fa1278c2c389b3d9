// `mixtrain eval` (docs/cli.md): the mean token cross-entropy and perplexity of a trained model
// (--checkpoint: our distributed checkpoint, written by any number of ranks) or of a Hugging Face
// model (--init-from: sets model.init_from) over held-out token shards (--data: a file, a glob,
// or a directory of val_*.bin), on any number of ranks (trainer/evaluator.h).
//
// The model is built as `mixtrain train` builds it from the same config (build_training_model:
// model_init_dtype, mix_precision, FSDP / HSDP / DDP / expert parallelism), then the checkpoint's
// model weights are loaded (restore_model_weights). Rank 0 prints one line to stdout,
//   eval_loss 3.141593 perplexity 23.1407 tokens 4096 windows 64
// or with --json one object {"eval_loss", "eval_ppl", "eval_tokens", "eval_windows", "step"}
// (step: the checkpoint's, null for --init-from). Exit 2 for what the arguments get wrong: a bad
// config, neither or both of --checkpoint / --init-from, --data naming no file or no window of
// seq_len + 1 tokens, a checkpoint that cannot be read or is not of this model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain {

struct EvalCommandOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set
  std::string checkpoint;              // --checkpoint
  std::string init_from;               // --init-from
  std::string data;                    // --data
  int64_t max_batches = -1;  // --max-batches: global batches (x data.global_batch_size windows);
                             // -1: data.eval_batches; 0: the whole set
  bool json = false;
  int nproc = 1;
};

int eval_command(const EvalCommandOptions& options, int argc, char** argv);

}  // namespace mixtrain
