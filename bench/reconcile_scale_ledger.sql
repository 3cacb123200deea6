INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status)
VALUES ('big', 'm', '{}', 'h', 's3://b/big', :queue, 64, 'active') RETURNING id;
INSERT INTO batches (run_id, seq, status, attempts, failures, input_key, n_samples, enqueued_at, heartbeat_at, worker,
                     started_at, finished_at, prompt_tokens, completion_tokens, output_key)
SELECT :run, g,
       CASE WHEN g <= :done THEN 'done' WHEN g <= :done + :running THEN 'running'
            WHEN g <= :done + :running + :queued THEN 'queued' ELSE 'planned' END,
       CASE WHEN g <= :done + :running THEN 1 ELSE 0 END, 0, 's3://b/big/inputs/group-' || g, 64,
       -- queued ones published in seq order, 1 ms apart, the last 10 s ago (within the grace period)
       CASE WHEN g <= :done + :running + :queued
            THEN now() - interval '10 seconds' - make_interval(secs => (:done + :running + :queued - g) * 0.001) END,
       CASE WHEN g > :done AND g <= :done + :running THEN now() + interval '1 day' END,
       CASE WHEN g <= :done + :running THEN 'gpu' || (g % 8) || '@n' || (g % 125) END,
       -- done ones finished at a 1,000-GPU farm's pace (~104 batches/s), the last one now
       CASE WHEN g <= :done THEN now() - make_interval(secs => (:done - g) * 0.0096 + 600)
            WHEN g <= :done + :running THEN now() END,
       CASE WHEN g <= :done THEN now() - make_interval(secs => (:done - g) * 0.0096) END,
       CASE WHEN g <= :done THEN 64 * 500 END, CASE WHEN g <= :done THEN 64 * 1500 END,
       CASE WHEN g <= :done THEN 's3://b/big/outputs/group-' || g END
FROM generate_series(1, :n) AS g;
-- The failed samples (the only sample rows `regen status` reads; the rest live in the counts below).
INSERT INTO samples (run_id, sample_id, batch_id, source_file, source_row, status, error, quality)
SELECT :run, 's' || g, b.id, 'data.jsonl', g, 'failed',
       (ARRAY['prompt_too_long', 'template_error', 'engine_error'])[1 + g % 3] || ': detail', 'failed'
FROM generate_series(1, :failed) AS g JOIN batches b ON b.run_id = :run AND b.seq = 1 + (g * 7919) % :done;
INSERT INTO run_sample_counts AS c (run_id, status, quality, n)
VALUES (:run, 'done', 'ok', :done * 64 * 9 / 10 - :failed), (:run, 'done', 'stub_answer', :done * 64 / 20),
       (:run, 'done', 'truncated_answer', :done * 64 / 20), (:run, 'pending', '', (:n - :done) * 64)
ON CONFLICT (run_id, shard, status, quality) DO UPDATE SET n = c.n + EXCLUDED.n
