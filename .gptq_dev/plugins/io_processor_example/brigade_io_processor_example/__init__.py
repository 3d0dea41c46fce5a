"""brigade-io-processor-example: an IO processor that returns completions as a small structure."""
