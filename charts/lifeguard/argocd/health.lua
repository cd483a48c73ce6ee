-- Argo CD health of Lifeguard objects (McpServerPolicy, CapabilityException,
-- PrincipalRevocation): the same reading of status as kstatus (Flux, kubectl wait).
--   Progressing: the operator has not written a status for this generation yet, it is still
--                working (Reconciling=True: sidecars not yet in sync, a revocation still
--                propagating, an exception not yet valid), or Ready is False.
--   Degraded:    Stalled=True: nothing changes without a change to the object (the policy
--                does not compile, the exception's signature does not verify or it expired).
--   Healthy:     Ready=True for the current generation.
local hs = {}
local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Lifeguard operator to report status"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Lifeguard operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = (stalled.reason or "") .. ": " .. (stalled.message or "")
  return hs
end
local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = (reconciling.reason or "") .. ": " .. (reconciling.message or "")
  return hs
end
local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or ""
  return hs
end
hs.status = "Progressing"
if ready ~= nil then
  hs.message = (ready.reason or "") .. ": " .. (ready.message or "")
else
  hs.message = "Waiting for the Ready condition"
end
return hs
