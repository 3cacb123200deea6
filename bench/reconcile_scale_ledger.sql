INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status)
VALUES ('big', 'm', '{}', 'h', 's3://b/big', 'regen', 64, 'active') RETURNING id;
INSERT INTO batches (run_id, seq, status, attempts, failures, input_key, n_samples, enqueued_at, heartbeat_at, worker)
SELECT :run, g,
       CASE WHEN g <= :done THEN 'done' WHEN g <= :done + :running THEN 'running'
            WHEN g <= :done + :running + :window THEN 'queued' ELSE 'planned' END,
       CASE WHEN g <= :done + :running THEN 1 ELSE 0 END, 0, 's3://b/big/inputs/group-' || g, 64,
       CASE WHEN g <= :done + :running + :window THEN now() - interval '2 hours' END,
       CASE WHEN g > :done AND g <= :done + :running THEN now() + interval '1 day' END,
       CASE WHEN g <= :done + :running THEN 'gpu0@n' || (g % 1000) END
FROM generate_series(1, :n) AS g
