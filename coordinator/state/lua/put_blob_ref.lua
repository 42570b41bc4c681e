-- ARGV[3] sha256, ARGV[4] path, ARGV[5] size in bytes.
local bk = key('blob', ARGV[3])
redis.call('HSET', bk, 'path', ARGV[4], 'size', ARGV[5])
redis.call('HSETNX', bk, 'created_ms', NOW)
return 1
