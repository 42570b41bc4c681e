-- ARGV[3] worker, ARGV[4] lease ms, ARGV[5..] capabilities in preference order.
-- Returns {task id, the task's hash as a flat list}, or nil when nothing is ready.
local worker = ARGV[3]
local lease_ms = tonumber(ARGV[4])
if redis.call('HGET', key('worker', worker), 'drain') == '1' then return false end  -- draining: no more
for i = 5, #ARGV do
  local q = key('ready', ARGV[i])
  local popped = redis.call('ZPOPMIN', q)
  while popped[1] do
    local tid = popped[1]
    local tk = key('task', tid)
    local t = redis.call('HMGET', tk, 'state', 'render', 'attempts')
    if t[1] == 'queued' and render_active(t[2]) then
      local fence = redis.call('INCR', key('fence'))
      local attempt = tonumber(t[3]) + 1
      local deadline = NOW + lease_ms
      redis.call('HSET', tk, 'state', 'leased', 'worker', worker, 'fence', fence, 'attempts', attempt,
        'leased_ms', NOW, 'deadline_ms', deadline, 'progress', '{}')
      redis.call('ZADD', key('leases'), deadline, tid)
      redis.call('HSET', key('worker', worker), 'state', 'busy', 'current_task', tid, 'last_seen_ms', NOW)
      local rk = key('render', t[2])
      if redis.call('HGET', rk, 'state') == 'queued' then
        redis.call('HSET', rk, 'state', 'running', 'started_ms', NOW)
        emit(t[2], {type = 'render_state', state = 'running'})
      end
      emit(t[2], {type = 'task_leased', task = tid, worker = worker, attempt = attempt, fence = fence,
        leased_ms = NOW, deadline_ms = deadline})
      return {tid, redis.call('HGETALL', tk)}
    elseif t[1] == 'queued' then
      redis.call('HSET', tk, 'state', 'cancelled')
    end
    popped = redis.call('ZPOPMIN', q)
  end
end
return false
