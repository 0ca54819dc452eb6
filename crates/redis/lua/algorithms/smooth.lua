-- Guava's SmoothBursty and SmoothWarmingUp (code 7): a port of
-- crates/core/src/algorithms/smooth.rs, operation for operation, so the
-- doubles come out bit for bit as the core's (and Guava's) do.
-- Parameters: p[1] kind (0 bursty, 1 warming up), p[2] permits per second,
-- p[3] stable interval (µs), p[4] max permits, p[5] threshold permits,
-- p[6] slope, p[7] created at (µs since the epoch), p[8] warm-up (µs; 0
-- when bursty).
-- Stored: v[3] stored permits (a double), v[4] next free (µs after the
-- base second v[2]).
-- The core counts in absolute i64 microseconds; here every microsecond is
-- relative to T.US (now's microsecond), so the integer differences the
-- core forms are formed exactly from small numbers, and converted to
-- doubles where the core converts them, giving the same doubles.
-- Wrapped in a loader, run on first use (see LOADERS in prelude.lua); its
-- locals do not count against the chunk's 200.
LOADERS[7] = function()

  -- The core's micros(now) for a relative `now` in ns, relative to T.US.
  local function smooth_now_us(now)
    return floor((T.SUBUS + now) / 1000)
  end

  local function cool_down_interval(p)
    if p[1] == 0 then return p[3] end
    return p[8] / p[4]
  end

  local function permits_to_time(p, permits)
    return p[3] + permits * p[6]
  end

  -- Guava truncates the trapezoid and the rectangle separately (both
  -- `as i64`), which is what makes its fifth cold-factor-10 wait 300227.
  local function stored_permits_to_wait_time(p, stored, take)
    if p[1] == 0 then return 0 end
    local above = stored - p[5]
    local micros = 0
    if above > 0 then
      local above_to_take = min(above, take)
      local length = permits_to_time(p, above)
        + permits_to_time(p, above - above_to_take)
      micros = trunc(above_to_take * length / 2.0)
      take = take - above_to_take
    end
    return micros + trunc(p[3] * take)
  end

  local function resync(p, st, now_us)
    if now_us > st.next_free then
      local new_permits = (now_us - st.next_free) / cool_down_interval(p)
      st.stored = min(p[4], st.stored + new_permits)
      st.next_free = now_us
    end
  end

  local function reserve_earliest_available(p, st, permits, now_us)
    resync(p, st, now_us)
    local moment = st.next_free
    local required = permits
    local from_storage = min(required, st.stored)
    local fresh_permits = required - from_storage
    local wait = stored_permits_to_wait_time(p, st.stored, from_storage)
      + trunc(fresh_permits * p[3])
    st.next_free = st.next_free + wait
    st.stored = st.stored - from_storage
    return moment
  end

  local function at(p, st, now_us)
    local s = { stored = st.stored, next_free = st.next_free }
    resync(p, s, now_us)
    return s
  end

  local function smooth_fresh(p)
    local stored = 0
    if p[1] == 1 then stored = p[4] end
    return { stored = stored, next_free = p[7] - T.US }
  end

  local function describe(p, st, now, grant, wait_us, min_hits)
    local now_us = smooth_now_us(now)
    local s = at(p, st, now_us)
    local debt = max(s.next_free - now_us, 0)
    local remaining = 0
    if debt == 0 then
      if p[1] == 0 then
        remaining = trunc(max(s.stored, 0)) + 1
      else
        remaining = 1
      end
    end
    local refill = trunc(max(p[4] - s.stored, 0) * cool_down_interval(p))
    -- `f64 as u64` saturates negatives to 0.
    local limit = max(trunc(max(p[4], 0)), 1)
    -- A request is granted from the first nanosecond of the microsecond
    -- its debt is paid, and the core's now need not be a whole
    -- microsecond: hence T.SUBUS.
    local retry = 0
    if debt ~= 0 and min_hits ~= 0 then
      retry = sat_sub(s.next_free * 1000, T.SUBUS + now)
    end
    return {
      granted = grant.granted,
      allowed = grant.allowed,
      limit = limit,
      remaining = remaining,
      reset_after = (debt + refill) * 1000,
      retry_after = retry,
      wait = wait_us * 1000,
    }
  end

  -- Guava's acquire: always grants, and says how long to sleep first.
  local function acquire(p, st, now, hits)
    local now_us = smooth_now_us(now)
    local moment = reserve_earliest_available(p, st, hits, now_us)
    return describe(p, st, now, { granted = hits, allowed = true },
      max(moment - now_us, 0), 1)
  end

  local function full(p, s, now_us)
    return s.next_free <= now_us and s.stored >= p[4]
  end

  ALG[7] = {
    name = 'smooth',
    fresh = function(p, now) return smooth_fresh(p) end,
    decode = function(p, v, base)
      return {
        stored = v[3],
        next_free = (base - T.S) * 1000000 + v[4] - (T.US - T.S * 1000000),
      }
    end,
    encode = function(p, st)
      return { st.stored, st.next_free + (T.US - T.S * 1000000) }
    end,
    -- Guava's canAcquire with no timeout: all or nothing, whatever the size.
    room = function(p, st, now, hits)
      if st.next_free <= smooth_now_us(now) then return hits end
      return 0
    end,
    commit = function(p, st, now, req, grant)
      local wait = 0
      if grant.granted > 0 then
        local now_us = smooth_now_us(now)
        local moment = reserve_earliest_available(p, st, grant.granted, now_us)
        wait = max(moment - now_us, 0)
      end
      return describe(p, st, now, grant, wait, req.min_hits)
    end,
    -- Idle only if a fresh state would also be full by now: before
    -- created_at (or a bursty key's first refill) a dropped key would come
    -- back different.
    is_idle = function(p, st, now)
      local now_us = smooth_now_us(now)
      return full(p, at(p, st, now_us), now_us)
        and full(p, at(p, smooth_fresh(p), now_us), now_us)
    end,
    -- Once both this state's and a fresh one's next free time have passed,
    -- refilling from empty takes at most max_permits cool-down intervals;
    -- a relative 2^-40 and a microsecond more cover the rounding of resync
    -- and the sub-microsecond part of now. Capped (at about 146 years) so
    -- that absurd parameters still give Redis a valid PX.
    ttl = function(p, st, now)
      local now_us = smooth_now_us(now)
      local debt = max(st.next_free - now_us, p[7] - T.US - now_us, 0)
      local refill = p[4] * cool_down_interval(p)
      local us = debt + ceil(refill + refill / 1099511627776) + 1
      return min(us * 1000, TWO52 * 1024)
    end,
    acquire_wait = function(p, st, now, hits)
      local probe = { stored = st.stored, next_free = st.next_free }
      return acquire(p, probe, now, hits).wait
    end,
    -- The wait of the whole plan does not matter: Guava charges the
    -- permits when they are reserved, not when they are used.
    acquire_at = function(p, st, now, hits, wait)
      return acquire(p, st, now, hits)
    end,
  }
end
