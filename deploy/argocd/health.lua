-- Argo CD health check for the sandboxes.dev/v1alpha1 kinds Sandbox, SandboxVolume and
-- SandboxTemplate (one script for all three: they report status the same way).
--
-- Install it with deploy/argocd/argocd-cm.yaml (resource.customizations.health.<group>_<Kind>).
-- Argo CD runs it with the live object in the global `obj` and expects a table with `status`
-- (Healthy, Progressing, Degraded, Suspended, Missing) and `message`. Only Lua 5.1 features and
-- the base, string and table libraries are used (Argo CD embeds gopher-lua, a Lua 5.1).
--
-- The verdicts follow the operator's status contract (kstatus conventions):
--   no status / status.observedGeneration behind metadata.generation  -> Progressing
--   Stalled=True     the operator cannot progress until the spec changes  -> Degraded
--   Reconciling=True the operator is working on it                          -> Progressing
--   Ready=True       converged                                               -> Healthy,
--                    except a Sandbox whose spec.state is Sleeping or Stopped, which is
--                    converged on a deliberately suspended state               -> Suspended
--   Ready=False with neither Reconciling nor Stalled: settled but not ready (for example the
--                    main process exited and restartPolicy keeps it down)    -> Degraded
--   Ready=Unknown or no Ready condition yet                                  -> Progressing
-- Missing is Argo CD's own verdict for an object that does not exist; this script never needs it.

local function condition(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c == nil then
    return fallback
  end
  local reason = c.reason or ""
  local message = c.message or ""
  if reason ~= "" and message ~= "" then
    return reason .. ": " .. message
  elseif message ~= "" then
    return message
  elseif reason ~= "" then
    return reason
  end
  return fallback
end

local function verdict(o)
  local kind = o.kind or "object"
  local meta = o.metadata or {}
  if meta.deletionTimestamp ~= nil then
    return "Progressing", kind .. " is being deleted: the operator is removing its provider resources"
  end
  local status = o.status
  if status == nil then
    return "Progressing", "Waiting for the operator to report status"
  end
  local generation = meta.generation
  local observed = status.observedGeneration
  if generation ~= nil and (observed == nil or observed < generation) then
    return "Progressing", "Waiting for the operator to observe generation " .. tostring(generation)
      .. " (observed " .. tostring(observed or "none") .. ")"
  end

  local conditions = status.conditions
  local stalled = condition(conditions, "Stalled")
  if stalled ~= nil and stalled.status == "True" then
    return "Degraded", describe(stalled, "Stalled: the spec must change before the operator can make progress")
  end
  local reconciling = condition(conditions, "Reconciling")
  if reconciling ~= nil and reconciling.status == "True" then
    return "Progressing", describe(reconciling, "Reconciling")
  end

  local ready = condition(conditions, "Ready")
  if ready == nil then
    return "Progressing", "Waiting for the Ready condition"
  end
  if ready.observedGeneration ~= nil and generation ~= nil and ready.observedGeneration < generation then
    return "Progressing", "Waiting for the Ready condition of generation " .. tostring(generation)
  end
  if ready.status == "True" then
    if kind == "Sandbox" and o.spec ~= nil and (o.spec.state == "Sleeping" or o.spec.state == "Stopped") then
      return "Suspended", describe(ready, "Sandbox is " .. o.spec.state)
    end
    return "Healthy", describe(ready, kind .. " is ready")
  end
  if ready.status == "False" then
    return "Degraded", describe(ready, kind .. " is not ready")
  end
  return "Progressing", describe(ready, "Ready is " .. tostring(ready.status))
end

local hs = {}
hs.status, hs.message = verdict(obj)
return hs
