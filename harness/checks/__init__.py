"""What a verdict is made of: the diff, comparing engines on one stream, recorded traces,
KV sizing, the seed table, the strategies and properties, and the mutants."""
