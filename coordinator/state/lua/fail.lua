-- ARGV[3] task, ARGV[4] worker, ARGV[5] fence, ARGV[6] error, ARGV[7] the error's class
-- ('permanent', 'transient' or 'unknown': common.lua task_fault), ARGV[8] '1' when
-- the worker reports it (its liveness too: idle now).
-- The task raised on this worker: an attempt spent there (common.lua task_failed has the policy).
local tid, worker = ARGV[3], ARGV[4]
if ARGV[8] == '1' then worker_seen(worker, 'idle', '') end
if not holder_render(tid, worker, ARGV[5]) then return 'stale' end
return task_failed(tid, worker, ARGV[6], ARGV[7])
