-- ARGV[3] task, ARGV[4] worker, ARGV[5] fence, ARGV[6] error, ARGV[7] '1' when retryable.
local tid, worker, err = ARGV[3], ARGV[4], ARGV[6]
local render = holder_render(tid, worker, ARGV[5])
if not render then return 'stale' end
local tk = key('task', tid)
local t = redis.call('HMGET', tk, 'leased_ms', 'attempts', 'max_attempts')
release(tid, worker, t[1], 'failed')
if not render_active(render) then
  redis.call('HSET', tk, 'state', 'cancelled', 'error', err)
  return 'stale'
end
local attempt = tonumber(t[2])
if ARGV[7] == '1' and attempt < tonumber(t[3]) then
  redis.call('HSET', tk, 'state', 'queued', 'error', err, 'queued_ms', NOW)
  push_ready(tid, true)  -- to the front: the rest of its step is waiting on it
  emit(render, {type = 'task_retry', task = tid, worker = worker, attempt = attempt, error = err})
  return 'requeued'
end
redis.call('HSET', tk, 'state', 'failed', 'error', err, 'done_ms', NOW)
emit(render, {type = 'task_failed', task = tid, worker = worker, attempt = attempt, error = err})
fail_render(render, tid, err)
return 'failed'
