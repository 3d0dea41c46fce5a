"""brigade-nixl: the ``NixlConnector`` KV connector, prefill/decode disaggregation through NIXL READs."""
