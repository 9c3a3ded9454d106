"""What a command runs: campaigns, the upgrade check, the rule report, the mutant hunt,
the benchmark, exports, rendered releases and the change log."""
