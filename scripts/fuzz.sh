#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/fuzz_targets/, entries in src/fuzz_entry.rs) with cargo-fuzz
# and libFuzzer: the GGUF reader, the safetensors header, config.json, tokenizer.json,
# chat templates, KServe binary infer bodies, gRPC ModelInferRequest messages and GBNF
# grammars. Each target starts from its seeds (fuzz/corpus/<target>/ and the fixtures
# fuzz/seeds.txt names) in a working corpus under fuzz/runs/ and runs FUZZ_SECONDS (default 600)
# seconds. A crash leaves its input under fuzz/artifacts/<target>/ and fails the script.
#   bash scripts/fuzz.sh [target...]      # all targets by default
# Installs cargo-fuzz when missing; libFuzzer's flags need a nightly compiler, so the
# stable toolchain is asked for them with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-600}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(gguf safetensors_header hf_config tokenizer_json chat_template kserve_infer grpc_infer gbnf)
FAILED=0
for t in "${TARGETS[@]}"; do
  WORK=fuzz/runs/$t
  mkdir -p "$WORK"
  cp -n fuzz/corpus/"$t"/* "$WORK"/ 2>/dev/null || true
  grep -v '^#' fuzz/seeds.txt | while read -r target dir ending; do
    [ "$target" = "$t" ] || continue
    find "$dir" -maxdepth 2 -type f -name "*$ending" | while read -r f; do
      cp -n "$f" "$WORK/$(basename "$(dirname "$f")")-$(basename "$f")"
    done
  done
  echo "== $t: $(ls "$WORK" | wc -l) inputs, ${SECONDS_EACH}s"
  if cargo fuzz run --fuzz-dir fuzz "$t" "$WORK" -- -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 \
      -max_len=1048576 > "fuzz/runs/$t.log" 2>&1; then
    echo "   $(grep -E '^(#[0-9]+|Done)' "fuzz/runs/$t.log" | tail -1)"
  else
    FAILED=1
    echo "   CRASH: $(grep -E 'panicked|ERROR|SUMMARY' "fuzz/runs/$t.log" | head -3)"
    ls fuzz/artifacts/"$t"/ 2>/dev/null | head -3
  fi
done
exit $FAILED
