"""The step loop: one stream through an engine, step by step (:mod:`.runner`)."""
