"""brigade-oot-model: an example model package. It adds OLMo to Brigade without editing the core."""
