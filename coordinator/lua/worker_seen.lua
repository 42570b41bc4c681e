-- ARGV[3] worker id, ARGV[4] state, ARGV[5] current task ('' for none).
redis.call('HSET', key('worker', ARGV[3]), 'state', ARGV[4], 'current_task', ARGV[5], 'last_seen_ms', NOW)
redis.call('SADD', key('workers'), ARGV[3])
return 1
