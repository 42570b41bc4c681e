-- ARGV[3] render id, ARGV[4] event JSON. Returns the stream id.
return emit(ARGV[3], cjson.decode(ARGV[4]))
