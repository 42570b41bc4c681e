-- ARGV[3] now in ms, or '' for the Redis clock. Returns the ids of the leases that ran out.
local now = NOW
if ARGV[3] ~= '' then now = tonumber(ARGV[3]) end
local expired = {}
for _, tid in ipairs(redis.call('ZRANGEBYSCORE', key('leases'), '-inf', now)) do
  local tk = key('task', tid)
  local t = redis.call('HMGET', tk, 'state', 'worker', 'render', 'leased_ms', 'attempts', 'max_attempts')
  if t[1] ~= 'leased' then
    redis.call('ZREM', key('leases'), tid)
  else
    -- A new fence at once: the old holder is stale even before anyone re-leases the task.
    redis.call('HSET', tk, 'fence', redis.call('INCR', key('fence')))
    release(tid, t[2], t[4], 'failed')
    expired[#expired + 1] = tid
    local attempt = tonumber(t[5])
    if not render_active(t[3]) then
      redis.call('HSET', tk, 'state', 'cancelled')
    else
      emit(t[3], {type = 'task_expired', task = tid, worker = t[2], attempt = attempt})
      if attempt >= tonumber(t[6]) then
        local err = 'lease expired on ' .. t[2] .. ' (attempt ' .. attempt .. ' of ' .. t[6] .. ')'
        redis.call('HSET', tk, 'state', 'failed', 'error', err, 'done_ms', NOW)
        fail_render(t[3], tid, err)
      else
        redis.call('HSET', tk, 'state', 'queued', 'error', 'lease expired on ' .. t[2], 'queued_ms', NOW)
        push_ready(tid, true)
      end
    end
  end
end
return expired
