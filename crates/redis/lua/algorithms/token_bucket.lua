-- The token bucket (code 1): a port of
-- crates/core/src/algorithms/token_bucket.rs. Tokens are kept as token-time
-- (tokens × interval, in nanoseconds), negative when in debt after an
-- acquire; `last` is when tokens were last taken, false for never (the
-- core's NEVER, u64::MAX).
-- Parameters: p[1] capacity, p[2] initial tokens, p[3] interval, p[4] full
-- time (capacity × interval), p[5] initial time (initial × interval),
-- p[6] debt time (max_debt × interval: how far below empty a report may
-- take the token-time).
-- Stored: v[3] token-time, v[4] last (T.put; absent for never).
-- Wrapped in a loader, run on first use (see LOADERS in prelude.lua); its
-- locals do not count against the chunk's 200.
LOADERS[1] = function()

  -- The core's MAX_SPAN (2^62), which caps a refill.
  local TB_MAX_SPAN = 4611686018427387904
  -- i64::MAX and i64::MIN as doubles (both round to ±2^63): the core
  -- saturates the cost of a take and the token-time at them. Only a debt
  -- past 2^53 ns (about 104 days, from acquires of interval × hits beyond
  -- the capacity) gets anywhere near them, and such a debt is already
  -- rounded: doubles, and the integer reply, cannot carry it exactly.
  local I64_MAX = 9223372036854775807
  local I64_MIN = -9223372036854775808

  -- `token_time.min(0).unsigned_abs()`, written so a zero is +0, not -0.
  local function tb_debt(tt)
    if tt < 0 then return -tt end
    return 0
  end

  -- Full, and unused for a whole refill time after repaying any debt
  -- (strictly after, so a request at the instant the bucket becomes full
  -- still sees it full).
  local function tb_forgotten(p, st, now)
    if not st.last then return true end
    local idle = sat_sub(now, st.last)
    local needed = p[4] + tb_debt(st.tt)
    return idle > needed
  end

  local function tb_level(p, st, now)
    if tb_forgotten(p, st, now) then return p[5] end
    -- Initial tokens above the capacity are spent, never refilled.
    if st.tt >= p[4] then return st.tt end
    local elapsed = min(sat_sub(now, st.last), TB_MAX_SPAN)
    return min(st.tt + elapsed, p[4])
  end

  local function tb_tokens(p, tt)
    if tt <= 0 then return 0 end
    return idiv(tt, p[3])
  end

  local function tb_take(p, st, now, hits)
    local cost = min(p[3] * hits, I64_MAX)
    local forgotten = tb_forgotten(p, st, now)
    st.tt = max(tb_level(p, st, now) - cost, I64_MIN)
    -- A time before the last use (a clock going backwards) must not move
    -- the refill origin back: that span would be refilled twice.
    if forgotten then
      st.last = now
    else
      st.last = max(st.last, now)
    end
  end

  local function tb_retry_after(p, st, now, min_hits)
    -- Granted now, even in debt after an acquire.
    if min_hits == 0 then return 0 end
    local level = tb_level(p, st, now)
    local needed = p[3] * min_hits
    if level >= 0 and level >= needed then return 0 end
    if min_hits <= p[1] then
      -- Refill adds one nanosecond of token-time per nanosecond.
      return max(needed - level, 0)
    end
    if min_hits <= p[2] and st.last then
      -- Only a forgotten bucket holds that many again.
      local at = st.last + p[4] + tb_debt(st.tt) + 1
      return sat_sub(at, now)
    end
    return false
  end

  local function tb_describe(p, st, now, req, grant)
    local level = tb_level(p, st, now)
    return {
      granted = grant.granted,
      allowed = grant.allowed,
      limit = p[1],
      remaining = tb_tokens(p, level),
      reset_after = max(p[4] - level, 0),
      retry_after = tb_retry_after(p, st, now, req.min_hits),
      wait = 0,
    }
  end

  -- The core's `acquire`: takes the tokens even into debt; the wait is the
  -- time to repay it.
  local function tb_acquire(p, st, now, hits)
    tb_take(p, st, now, hits)
    local d = tb_describe(p, st, now, { hits = hits, min_hits = hits },
      { granted = hits, allowed = true })
    d.wait = tb_debt(st.tt)
    d.retry_after = tb_retry_after(p, st, now, 1)
    return d
  end

  -- Usage::report (charge into debt, down to -p[6]) and refund (back up
  -- to a full bucket, never lowering one that holds more; a forgotten
  -- bucket gets nothing). The decision is described for one more hit.
  local function tb_usage(p, st, now, hits, refund)
    local n = 0
    if refund then
      if not tb_forgotten(p, st, now) then
        local level = tb_level(p, st, now)
        local top = max(level, p[4])
        if level + p[3] * hits <= top then
          st.tt = level + p[3] * hits
          n = hits
        else
          st.tt = top
          n = idiv(top - level, p[3])
        end
        st.last = max(st.last, now)
      end
    else
      local level = tb_level(p, st, now)
      n = min(hits, idiv(max(level + p[6], 0), p[3]))
      if n > 0 then tb_take(p, st, now, n) end
    end
    return tb_describe(p, st, now, { hits = 1, min_hits = 1 },
      { granted = n, allowed = true })
  end

  ALG[1] = {
    name = 'token_bucket',
    fresh = function(p, now) return { tt = p[5], last = false } end,
    decode = function(p, v, base)
      local last = false
      if v[4] then last = T.get(v[4], base) end
      return { tt = v[3], last = last }
    end,
    encode = function(p, st)
      if not st.last then return { st.tt } end
      return { st.tt, T.put(st.last) }
    end,
    room = function(p, st, now, hits)
      return min(tb_tokens(p, tb_level(p, st, now)), hits)
    end,
    commit = function(p, st, now, req, grant)
      if grant.granted > 0 then
        tb_take(p, st, now, grant.granted)
      elseif tb_forgotten(p, st, now) and p[2] < p[1] then
        -- A new bucket below capacity starts refilling from its first
        -- request, even a rejected one; nothing is taken.
        tb_take(p, st, now, 0)
      end
      return tb_describe(p, st, now, req, grant)
    end,
    is_idle = function(p, st, now) return tb_forgotten(p, st, now) end,
    usage = tb_usage,
    -- Forgotten once idle for longer than a refill time plus the debt.
    ttl = function(p, st, now)
      if not st.last then return 0 end
      return sat_sub(st.last + p[4] + tb_debt(st.tt) + 1, now)
    end,
    -- The core's Limit::acquire_wait: an acquire on a copy of the state.
    acquire_wait = function(p, st, now, hits)
      local probe = { tt = st.tt, last = st.last }
      return tb_acquire(p, probe, now, hits).wait
    end,
    acquire_at = function(p, st, now, hits, wait)
      return tb_acquire(p, st, now, hits)
    end,
  }
end
