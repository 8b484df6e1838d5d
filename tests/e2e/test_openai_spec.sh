#!/usr/bin/env bash
# Speculative decoding (NEXTN) end to end. With the demo model's own trained MTP layer,
# test_spec_greedy.mjs compares a speculating server with a plain one and requires a mean accept
# length of at least 2.5 of 4 on its prompts. Then a copy of the demo gets a random MTP layer instead
# (tools/add_mtp.py --replace, standard library only, into a temporary directory): the same comparison,
# and the openai-SDK suites run against `serve --speculative-algorithm NEXTN` (random MTP weights make drafts that are mostly rejected: every step rolls KV back, and
# every suite must still pass unchanged: streaming, stop strings, logprobs, n > 1, seeds, tools,
# structured outputs, concurrency, the prefix cache).
set -u
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 tools/add_mtp.py models/demo "$tmp/demo" --replace >/dev/null; then
  echo "tools/add_mtp.py failed"; echo "## tests/e2e/test_openai_spec.sh: 0 passed, 1 failed"; exit 1
fi
rc=0
echo "=== test_spec_greedy.mjs with the demo's trained MTP layer"
MS_TEST_MODEL=models/demo MS_MIN_ACCEPT=2.5 node tests/e2e/test_spec_greedy.mjs || rc=1
echo "=== test_spec_greedy.mjs with a random MTP layer"
MS_TEST_MODEL="$tmp/demo" node tests/e2e/test_spec_greedy.mjs || rc=1
echo "=== test_spec_greedy.mjs with --tp 2"
MS_TEST_MODEL="$tmp/demo" MS_SERVE_ARGS="--tp 2" node tests/e2e/test_spec_greedy.mjs || rc=1
for t in test_openai_chat.mjs test_openai_completions.mjs test_structured_outputs.mjs test_schema_corpus.mjs test_openai_concurrency.mjs \
         test_prefix_cache.mjs; do
  echo "=== $t with --speculative-algorithm NEXTN"
  MS_TEST_MODEL="$tmp/demo" MS_SERVE_ARGS="--speculative-algorithm NEXTN --speculative-num-steps 3" node "tests/e2e/$t" || rc=1
done
exit $rc
