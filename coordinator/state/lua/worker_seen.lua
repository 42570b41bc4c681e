-- ARGV[3] worker id, ARGV[4] state, ARGV[5] current task ('' for none).
worker_seen(ARGV[3], ARGV[4], ARGV[5])
return 1
