#!/usr/bin/env bash
# The openai-SDK end-to-end suites against `moeserve serve --tp 2` (two CPU ranks as threads, the
# in-process communicator): a split model must serve exactly as one rank does, streaming and not,
# under concurrency and with the prefix cache, malformed requests answered the same way,
# with reasoning, tools, logprobs, n > 1 and seeds.
set -u
cd "$(dirname "$0")/../.."
rc=0
for t in test_openai_chat.mjs test_openai_completions.mjs test_openai_tools.mjs test_openai_errors.mjs \
         test_openai_concurrency.mjs test_prefix_cache.mjs; do
  echo "=== $t with --tp 2"
  MS_SERVE_ARGS="--tp 2" node "tests/e2e/$t" || rc=1
done
exit $rc
