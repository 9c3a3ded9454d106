"""The data and its files: streams, traces, step records, kept streams, public request
traces, the scripted model and the mutant record.  Imports nothing of the harness above."""
