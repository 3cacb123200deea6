"""What the producer and the workers agree on.

The Postgres ledger (runs, batches, samples: the truth about every sample), the
objects it points to (input and output shards in S3, their keys and codec), the
dispatch channel (the Celery app, queues and task message) and the settings that
connect to all three. Nothing here imports vLLM or torch.
"""
