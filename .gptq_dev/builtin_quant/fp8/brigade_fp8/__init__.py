"""brigade-fp8: ``--quantization fp8`` turns an unquantized checkpoint's linear weights into FP8 (e4m3) at load."""
