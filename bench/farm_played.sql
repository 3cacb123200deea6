INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status)
VALUES ('farm-played-heartbeats', 'm', '{}', 'h', 's3://b/played', 'farm-played-none', 64, 'active') RETURNING id;
INSERT INTO batches (run_id, seq, status, attempts, failures, input_key, n_samples, enqueued_at, started_at,
                     heartbeat_at, worker)
SELECT :run, g, 'running', 1, 0, 's3://b/played/' || g, 64, now(), now(), now(), 'played' || g
FROM generate_series(1, :n) AS g
RETURNING id
