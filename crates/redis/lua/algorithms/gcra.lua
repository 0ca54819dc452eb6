-- GCRA and the leaky bucket (codes 2 and 3): a port of
-- crates/core/src/algorithms/gcra.rs and leaky_bucket.rs. Both keep one
-- theoretical arrival time (tat); a fresh state's tat is long ago.
-- Parameters: p[1] interval, p[2] burst (queue size), p[3] tolerance,
-- p[4] debt (max_debt × interval: how much further than the tolerance a
-- report may push the tat).
-- Wrapped in a loader, run on first use (see LOADERS in prelude.lua); its
-- locals do not count against the chunk's 200.
LOADERS[2] = function()

  local function gcra_room_at(p, tat, now)
    local free = sat_sub(now + p[3], max(tat, now))
    return idiv(free, p[1])
  end

  local function gcra_retry_after(p, tat, now, min_hits)
    if min_hits > p[2] then return false end
    if min_hits == 0 then return 0 end
    local needed = sat_sub(tat + p[1] * min_hits, p[3])
    return sat_sub(needed, now)
  end

  local function gcra_describe(p, st, now, req, grant)
    return {
      granted = grant.granted,
      allowed = grant.allowed,
      limit = p[2],
      remaining = gcra_room_at(p, st.tat, now),
      reset_after = sat_sub(st.tat, now),
      retry_after = gcra_retry_after(p, st.tat, now, req.min_hits),
      wait = 0,
    }
  end

  local function gcra_advance(p, st, now, hits)
    local start = max(st.tat, now)
    st.tat = start + p[1] * hits
    return start
  end

  -- Gcra::charge: up to `hits` into debt; the hits charged.
  local function gcra_charge(p, st, now, hits)
    local start = max(st.tat, now)
    local fits = idiv(sat_sub(now + p[3] + p[4], start), p[1])
    local charged = min(hits, fits)
    if charged > 0 then gcra_advance(p, st, now, charged) end
    return charged
  end

  -- Gcra::give_back: the tat moves back by up to `hits`, never before now.
  local function gcra_give_back(p, st, now, hits)
    local ahead = sat_sub(st.tat, now)
    if p[1] * hits <= ahead then
      st.tat = st.tat - p[1] * hits
      return hits
    end
    if st.tat > now then st.tat = now end
    return idiv(ahead, p[1])
  end

  -- Usage::report and refund; the decision is described for one more hit.
  local function gcra_usage(p, st, now, hits, refund)
    local n
    if refund then n = gcra_give_back(p, st, now, hits)
    else n = gcra_charge(p, st, now, hits) end
    return gcra_describe(p, st, now, { hits = 1, min_hits = 1 },
      { granted = n, allowed = true })
  end

  local GCRA = {
    name = 'gcra',
    fresh = function(p, now) return { tat = PAST } end,
    decode = function(p, v, base) return { tat = T.get(v[3], base) } end,
    encode = function(p, st) return { T.put(st.tat) } end,
    room = function(p, st, now, hits)
      local free = sat_sub(now + p[3], max(st.tat, now))
      if hits * p[1] <= free then return hits end
      return min(idiv(free, p[1]), hits)
    end,
    commit = function(p, st, now, req, grant)
      if grant.granted > 0 then gcra_advance(p, st, now, grant.granted) end
      return gcra_describe(p, st, now, req, grant)
    end,
    is_idle = function(p, st, now) return st.tat <= now end,
    ttl = function(p, st, now) return sat_sub(st.tat, now) end,
    usage = gcra_usage,
    acquire_wait = function(p, st, now, hits)
      local probe = { tat = st.tat }
      gcra_advance(p, probe, now, hits)
      return sat_sub(sat_sub(probe.tat, p[3]), now)
    end,
    acquire_at = function(p, st, now, hits, wait)
      gcra_advance(p, st, now, hits)
      local d = gcra_describe(p, st, now, { hits = hits, min_hits = hits },
        { granted = hits, allowed = true })
      d.wait = sat_sub(sat_sub(st.tat, p[3]), now)
      d.retry_after = gcra_retry_after(p, st.tat, now, 1)
      return d
    end,
  }
  ALG[2] = GCRA

  local function leaky_decision(p, st, now, req, grant)
    local d = gcra_describe(p, st, now, req, grant)
    if grant.granted > 0 then
      d.wait = sat_sub(sat_sub(st.tat, p[1]), now)
    end
    return d
  end

  ALG[3] = {
    name = 'leaky_bucket',
    fresh = GCRA.fresh,
    decode = GCRA.decode,
    encode = GCRA.encode,
    room = GCRA.room,
    commit = function(p, st, now, req, grant)
      if grant.granted > 0 then gcra_advance(p, st, now, grant.granted) end
      return leaky_decision(p, st, now, req, grant)
    end,
    is_idle = GCRA.is_idle,
    ttl = GCRA.ttl,
    -- Nothing waits for reported or refunded hits: the meter's decisions.
    usage = gcra_usage,
    -- Unlike GCRA's, a leaky bucket's wait is until its own slot starts.
    acquire_wait = function(p, st, now, hits)
      local probe = { tat = st.tat }
      gcra_advance(p, probe, now, hits)
      if hits == 0 then return 0 end
      return sat_sub(sat_sub(probe.tat, p[1]), now)
    end,
    acquire_at = function(p, st, now, hits, wait)
      gcra_advance(p, st, now, hits)
      return leaky_decision(p, st, now, { hits = hits, min_hits = min(hits, 1) },
        { granted = hits, allowed = true })
    end,
  }
end
LOADERS[3] = LOADERS[2]
