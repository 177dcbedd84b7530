#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time (default 60 s each).
#
#   scripts/fuzz.sh            # every target, 60 s each
#   scripts/fuzz.sh 300        # every target, 5 min each
#   scripts/fuzz.sh 60 model_ops
#
# cargo-fuzz needs nightly flags (-Zsanitizer, coverage instrumentation). On a
# stable toolchain RUSTC_BOOTSTRAP=1 unlocks them; set FUZZ_TOOLCHAIN=nightly
# to use a nightly toolchain instead. Not part of CI: the property tests
# (tests/conformance/model_equivalence.rs and friends) run there; fuzzing runs from here.
# Crashes land in fuzz/artifacts/<target>/, the corpus in fuzz/corpus/<target>/
# (both git-ignored); reproduce with `cargo fuzz run <target> <artifact>`.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(extract_keys model_ops)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

run() {
  if [ -n "${FUZZ_TOOLCHAIN:-}" ]; then
    cargo "+${FUZZ_TOOLCHAIN}" fuzz "$@"
  else
    RUSTC_BOOTSTRAP=1 cargo fuzz "$@"
  fi
}

status=0
for t in "${targets[@]}"; do
  echo "== fuzzing $t for ${secs}s"
  if ! run run -O "$t" -- -max_total_time="$secs" -rss_limit_mb=2048; then
    echo "!! $t found a failure: see fuzz/artifacts/$t/"
    status=1
  fi
done
exit $status
