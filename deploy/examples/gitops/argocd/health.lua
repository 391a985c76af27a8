-- Argo CD health check for gpuval.io/GpuValidation (Lua 5.1, as Argo CD runs it).
-- Install it under resource.customizations.health.gpuval.io_GpuValidation in argocd-cm
-- (argocd-cm.yaml beside this file carries the same text).
--
-- Healthy: the run passed (Ready=True). Degraded: it failed or cannot run (Stalled=True).
-- Progressing: anything else: no status yet, the operator has not seen the current spec,
-- or agents are still running. Conditions count only when they describe the current
-- generation, so an edited validation is never reported on its previous run.
local hs = {}
local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
  if obj.metadata.deletionTimestamp ~= nil then
    hs.status = "Progressing"
    hs.message = "The validation is being deleted"
    return hs
  end
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the gpuval operator to pick up the validation"
  return hs
end

if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the gpuval operator to observe generation " .. tostring(generation)
  return hs
end

local function condition(kind)
  if obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      if generation == nil or c.observedGeneration == nil or c.observedGeneration == generation then
        return c
      end
    end
  end
  return nil
end

local function text(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

local stalled = condition("Stalled")
local ready = condition("Ready")
local reconciling = condition("Reconciling")

if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = text(stalled, "The validation failed")
elseif ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = text(ready, "The validation passed")
else
  hs.status = "Progressing"
  local phase = obj.status.phase
  if phase == nil then
    phase = "Pending"
  end
  hs.message = text(reconciling, "Phase " .. phase)
end
return hs
