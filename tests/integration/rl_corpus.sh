# Sourced by the RL integration tests: the tiny pretraining corpus and model they share.
# make_rl_corpus ORRERY DIR TRANSCRIPTS MAX_SEQ_LEN writes into DIR: calc.jsonl (calculator
# transcripts, difficulty 1), text.txt (a little plain text), tokenizer.json (320 ids), data/ (token
# shards, 10% held out) and model.toml (tests/fixtures/small_hybrid_model.toml with max_seq_len
# set). Returns non-zero, naming the step, when one fails.
make_rl_corpus() {
  local orrery="$1" dir="$2" count="$3" max_seq_len="$4"
  "$orrery" env synth --env calc --count "$count" --seed 1 --difficulty 1 \
    --out "$dir/calc.jsonl" >/dev/null || { echo "make_rl_corpus: env synth failed" >&2; return 1; }
  for _ in $(seq 1 40); do echo "in the beginning was the word and the word was with the light."; done \
    >"$dir/text.txt"
  "$orrery" tokenizer train --input "$dir/text.txt" "$dir/calc.jsonl" --vocab-size 320 \
    --out "$dir/tokenizer.json" >/dev/null ||
    { echo "make_rl_corpus: tokenizer train failed" >&2; return 1; }
  "$orrery" data prepare --tokenizer "$dir/tokenizer.json" --input "$dir/text.txt" \
    "$dir/calc.jsonl" --out "$dir/data" --heldout-fraction 0.1 --seed 3 >/dev/null ||
    { echo "make_rl_corpus: data prepare failed" >&2; return 1; }
  sed "s/^max_seq_len = .*/max_seq_len = $max_seq_len/" \
    "$(dirname "${BASH_SOURCE[0]}")/../fixtures/small_hybrid_model.toml" >"$dir/model.toml"
}
