INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status)
VALUES ('big', 'm', '{}', 'h', 's3://b/big', 'regen', 64, 'active') RETURNING id;
-- seq order: done, dead, running, queued, planned. 1 in 50 done batches failed once before it committed,
-- dead ones failed 3 times; the first :refused queued ones were last refused by a worker of another model.
INSERT INTO batches (run_id, seq, status, attempts, failures, input_key, n_samples, enqueued_at, heartbeat_at, worker,
                     started_at, finished_at, prompt_tokens, completion_tokens, output_key, error)
SELECT :run, g,
       CASE WHEN g <= :done THEN 'done' WHEN g <= :done + :dead THEN 'dead'
            WHEN g <= :done + :dead + :running THEN 'running'
            WHEN g <= :done + :dead + :running + :queued THEN 'queued' ELSE 'planned' END,
       CASE WHEN g <= :done THEN 1 + (g % 50 = 0)::int WHEN g <= :done + :dead THEN 3
            WHEN g <= :done + :dead + :running THEN 1 ELSE 0 END,
       CASE WHEN g <= :done THEN (g % 50 = 0)::int WHEN g <= :done + :dead THEN 3 ELSE 0 END,
       's3://b/big/inputs/group-' || g, 64,
       CASE WHEN g <= :done + :dead + :running + :queued THEN now() - interval '10 seconds' END,
       CASE WHEN g > :done + :dead AND g <= :done + :dead + :running THEN now() - interval '3 seconds' END,
       CASE WHEN g <= :done OR (g > :done + :dead AND g <= :done + :dead + :running) THEN 'gpu' || (g % 8) || '@n' || (g % 125) END,
       -- done ones finished at a 1,000-GPU farm's pace (~104 batches/s), the last one now
       CASE WHEN g <= :done THEN now() - make_interval(secs => (:done - g) * 0.0096 + 600)
            WHEN g > :done + :dead AND g <= :done + :dead + :running THEN now() END,
       CASE WHEN g <= :done THEN now() - make_interval(secs => (:done - g) * 0.0096)
            WHEN g <= :done + :dead THEN now() - interval '1 hour' END,
       CASE WHEN g <= :done THEN 64 * 500 END, CASE WHEN g <= :done THEN 64 * 1500 END,
       CASE WHEN g <= :done THEN 's3://b/big/outputs/group-' || g END,
       CASE WHEN g > :done AND g <= :done + :dead THEN 'engine died: CUDA error: an illegal memory access'
            WHEN g > :done + :dead + :running AND g <= :done + :dead + :running + :refused
            THEN 'refused by gpu0@other: model other-model, not m' END
FROM generate_series(1, :n) AS g;
-- A fake-engine worker on the real queue refused a delivery of the first :fake_refused queued batches.
UPDATE batches SET fake_refusals = 1 WHERE run_id = :run AND seq > :done + :dead + :running
                                         AND seq <= :done + :dead + :running + :fake_refused;
-- Rejected rows: 1 in 100 of the run's input rows, 6 reasons.
INSERT INTO rejected_rows (run_id, source_file, source_row, reason, detail)
SELECT :run, 'part-' || (g / 100000) || '.jsonl', g,
       (ARRAY['malformed_json', 'duplicate_id', 'missing_field', 'too_large', 'no_user_turn', 'invalid_tools'])[1 + g % 6],
       'detail of the row'
FROM generate_series(1, :rejected) AS g;
INSERT INTO run_sample_counts AS c (run_id, status, quality, n)
VALUES (:run, 'done', 'ok', :done * 64 * 9 / 10 - :failed), (:run, 'done', 'stub_answer', :done * 64 / 20),
       (:run, 'done', 'truncated_answer', :done * 64 / 20), (:run, 'failed', 'failed', :failed),
       (:run, 'pending', '', (:n - :done) * 64)
ON CONFLICT (run_id, shard, status, quality) DO UPDATE SET n = c.n + EXCLUDED.n
