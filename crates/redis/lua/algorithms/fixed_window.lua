-- The fixed window counter (code 4): a port of
-- crates/core/src/algorithms/fixed_window.rs. The state is the start of the
-- window its count belongs to, and that count; a fresh state counts
-- nothing (its start, the epoch, is long ago).
-- Parameters: p[1] limit, p[2] window, p[3] align (0 epoch, 1 first hit),
-- and last (p[#p]) max_debt, the hits a report may count beyond the limit.
-- Stored: v[3] start (T.put), v[4] count.
-- Wrapped in a loader, run on first use (see LOADERS in prelude.lua); its
-- locals do not count against the chunk's 200.
LOADERS[4] = function()

  -- Whether the stored window still covers `now`. A time before the window
  -- (a clock going backwards) keeps it: forgetting hits because time went
  -- backwards would be an exploit.
  local function fw_current(p, st, now)
    return st.count > 0 and now < st.start + p[2]
  end

  local function fw_count(p, st, now)
    if fw_current(p, st, now) then return st.count end
    return 0
  end

  local function fw_window_start(p, now)
    -- Epoch windows start at multiples of the window since the Unix epoch,
    -- which only the absolute time knows.
    if p[3] == 0 then return now - T.mod(now, p[2]) end
    return now
  end

  ALG[4] = {
    name = 'fixed_window',
    fresh = function(p, now) return { start = PAST, count = 0 } end,
    decode = function(p, v, base)
      return { start = T.get(v[3], base), count = v[4] }
    end,
    encode = function(p, st) return { T.put(st.start), st.count } end,
    room = function(p, st, now, hits)
      return min(sat_sub(p[1], fw_count(p, st, now)), hits)
    end,
    commit = function(p, st, now, req, grant)
      if grant.granted > 0 then
        if not fw_current(p, st, now) then
          st.start = fw_window_start(p, now)
          st.count = 0
        end
        st.count = st.count + grant.granted
      end
      local count = fw_count(p, st, now)
      local until_end = 0
      if count > 0 then until_end = sat_sub(st.start + p[2], now) end
      local retry_after
      if req.min_hits > p[1] then
        retry_after = false
      elseif count + req.min_hits <= p[1] then
        retry_after = 0
      else
        retry_after = until_end
      end
      return {
        granted = grant.granted,
        allowed = grant.allowed,
        limit = p[1],
        remaining = sat_sub(p[1], count),
        reset_after = until_end,
        retry_after = retry_after,
        wait = 0,
      }
    end,
    is_idle = function(p, st, now) return not fw_current(p, st, now) end,
    ttl = function(p, st, now)
      if not fw_current(p, st, now) then return 0 end
      return sat_sub(st.start + p[2], now)
    end,
  }

  -- Usage::report and refund, through commit as in the core: a report is
  -- a grant the limit did not check, a refund uncounts hits first.
  ALG[4].usage = function(p, st, now, hits, refund)
    local one = { hits = 1, min_hits = 1 }
    if refund then
      local back = min(hits, fw_count(p, st, now))
      st.count = st.count - back
      local d = ALG[4].commit(p, st, now, one, { granted = 0, allowed = true })
      d.granted = back
      return d
    end
    local n = min(hits, sat_sub(p[1] + p[#p], fw_count(p, st, now)))
    return ALG[4].commit(p, st, now, one, { granted = n, allowed = true })
  end
end
