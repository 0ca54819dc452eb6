-- The sliding log (code 6): a port of
-- crates/core/src/algorithms/sliding_log.rs, on the shared HitLog.
-- Parameters: p[1] limit, p[2] window, p[3] min_gap (0: none),
-- p[4] count_rejected (0/1), p[5] max_debt (hits a report may log beyond
-- the limit).
-- Stored: the log, in HitLog's layout (pairs of time and hits from v[3]).
-- The core subtracts the window from an absolute now with saturation;
-- relative times need none (a real now is decades past any window).
-- Wrapped in a loader, run on first use (see LOADERS in prelude.lua); its
-- locals do not count against the chunk's 200.
LOADERS[6] = function()
  hit_log_load()

  local function sl_count(p, log, now)
    return HitLog.count_since(log, now - p[2])
  end

  local function sl_gap_open(p, log, now)
    if p[3] == 0 then return true end
    local t = HitLog.newest(log)
    return t == nil or now >= t + p[3]
  end

  -- The first instant from `from` at which the log has room for `hits`
  -- (<= limit) and min_gap has passed since its newest hit.
  local function sl_earliest(p, log, from, hits)
    local at = from
    local t = HitLog.blocking_entry(log, p[1] - hits)
    if t then at = max(at, t + p[2] + 1) end
    if p[3] > 0 then
      local newest = HitLog.newest(log)
      if newest then at = max(at, newest + p[3]) end
    end
    return at
  end

  local function sl_retry_after(p, log, now, min_hits)
    if min_hits > p[1] then return false end
    -- Granted now, even while min_gap closes the log.
    if min_hits == 0 then return 0 end
    return sat_sub(sl_earliest(p, log, now, min_hits), now)
  end

  local function sl_describe(p, log, now, req, grant)
    local reset_after = 0
    local newest = HitLog.newest(log)
    if newest then
      reset_after = sat_sub(max(newest + p[2] + 1, newest + p[3]), now)
    end
    local remaining = 0
    if sl_gap_open(p, log, now) then
      remaining = sat_sub(p[1], sl_count(p, log, now))
    end
    return {
      granted = grant.granted,
      allowed = grant.allowed,
      limit = p[1],
      remaining = remaining,
      reset_after = reset_after,
      retry_after = sl_retry_after(p, log, now, req.min_hits),
      wait = 0,
    }
  end

  -- SlidingLog::schedule: no earlier than the newest logged hit, so the
  -- log stays in time order; nil when more than the limit is asked.
  local function sl_schedule(p, log, now, hits)
    if hits > p[1] then return nil end
    local from = now
    local newest = HitLog.newest(log)
    if newest and newest > now then from = newest end
    return sat_sub(sl_earliest(p, log, from, hits), now)
  end

  ALG[6] = {
    name = 'sliding_log',
    fresh = function(p, now) return { log = HitLog.new() } end,
    decode = function(p, v, base)
      return { log = HitLog.decode(v, 3, floor((#v - 2) / 2), base) }
    end,
    encode = function(p, st)
      local out = {}
      HitLog.encode(st.log, out)
      return out
    end,
    room = function(p, st, now, hits)
      if not sl_gap_open(p, st.log, now) then return 0 end
      return min(sat_sub(p[1], sl_count(p, st.log, now)), hits)
    end,
    commit = function(p, st, now, req, grant)
      HitLog.prune(st.log, now - p[2])
      if grant.granted > 0 then
        HitLog.push(st.log, now, grant.granted, p[1])
      elseif not grant.allowed and p[4] == 1 then
        -- Past the limit only after a report: the attempt renews the block
        -- without forgiving the debt.
        HitLog.push(st.log, now, max(req.hits, 1), max(p[1], HitLog.total(st.log)))
      end
      return sl_describe(p, st.log, now, req, grant)
    end,
    is_idle = function(p, st, now)
      return sl_count(p, st.log, now) == 0 and sl_gap_open(p, st.log, now)
    end,
    -- A report logs up to limit + max_debt hits; a refund forgets the
    -- newest hits still in the window.
    usage = function(p, st, now, hits, refund)
      HitLog.prune(st.log, now - p[2])
      local n
      if refund then
        n = HitLog.take_newest(st.log, hits)
      else
        local keep = p[1] + p[5]
        n = min(hits, sat_sub(keep, HitLog.total(st.log)))
        HitLog.push(st.log, now, n, keep)
      end
      return sl_describe(p, st.log, now, { hits = 1, min_hits = 1 },
        { granted = n, allowed = true })
    end,
    -- Idle once the newest hit has left the window and min_gap has passed
    -- since it: what reset_after says.
    ttl = function(p, st, now)
      local newest = HitLog.newest(st.log)
      if not newest then return 0 end
      return sat_sub(max(newest + p[2] + 1, newest + p[3]), now)
    end,
    acquire_wait = function(p, st, now, hits)
      return sl_schedule(p, st.log, now, hits)
    end,
    -- Limit::acquire_at: the hits are logged when the request proceeds,
    -- after the longer of this log's own wait and the plan's.
    acquire_at = function(p, st, now, hits, wait)
      local own = sl_schedule(p, st.log, now, hits)
      local at = now + max(own, wait)
      HitLog.prune(st.log, now - p[2])
      HitLog.push(st.log, at, hits, p[1])
      local d = sl_describe(p, st.log, now, { hits = hits, min_hits = min(hits, 1) },
        { granted = hits, allowed = true })
      d.wait = sat_sub(at, now)
      return d
    end,
  }
end
