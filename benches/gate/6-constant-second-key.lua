redis.call("set", KEYS[1], ARGV[1]) if redis.call("get", KEYS[1]) == ARGV[1] then local n = redis.call("del", KEYS[1], "redlock:\255waited") if n == 1 then return 1 end return 1 else return 0 end
