"""brigade-oot-platform: an example out-of-tree Brigade platform that runs on the CPU."""
