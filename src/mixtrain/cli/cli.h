// The `mixtrain` command line: parses argv, runs one command, returns the process exit code.
//
//   mixtrain train --config FILE [--set k=v]... [--run-dir DIR]
//   mixtrain config show FILE [--set k=v]...
//   mixtrain ckpt inspect|verify DIR;  mixtrain ckpt diff A B [--atol X]
//   mixtrain data prepare --tokenizer tokenizer.json --input FILE... --out DIR [...]
//
// Exit codes: 0 success, 1 runtime error (data file, I/O), 2 bad configuration or flags,
// 130 interrupted by Ctrl-C (metrics flushed). Every error is one line on stderr.
#pragma once

namespace mixtrain {

int run_cli(int argc, char** argv);

}  // namespace mixtrain
