"""Prompt-lookup speculative decoding, the scheduler's side: config, drafting, the choice of k."""
