"""Workers: one per device. Each owns a model runner; the executor drives them."""
