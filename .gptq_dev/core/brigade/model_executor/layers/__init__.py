"""Model layers written against Brigade's interfaces: norms, rotary, activation, linear, vocab, attention."""
