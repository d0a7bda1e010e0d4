-- Runs an Argo CD health check script the way Argo CD does, for tests/gitops.rs:
--
--   lua5.4 run-health.lua deploy/argocd/health.lua < object.json
--   lua5.1 run-health.lua deploy/argocd/health.lua < object.json
--
-- stdin holds one Kubernetes object as JSON (e.g. `kubectl get sbx NAME -o json`). It is
-- decoded into Lua tables the way Argo CD converts objects (JSON null and absent fields are
-- nil, arrays are 1-based sequences), put in the global `obj` of a fresh environment that offers
-- only what Argo CD's sandbox does (base functions, string, table, math: no io, os, require),
-- and the script's result is printed as `<status>\t<message>`. Exit status 1 when the script
-- fails or returns something other than a table with a string `status`.
-- Written for Lua 5.1 (Argo CD's gopher-lua) and 5.4 alike.

local function fail(msg)
  io.stderr:write("run-health.lua: " .. msg .. "\n")
  os.exit(1)
end

-- ---- a small JSON decoder ---------------------------------------------------
local decode

local function skip(s, i)
  local _, e = string.find(s, "^[ \t\r\n]*", i)
  return e + 1
end

local function utf8_char(cp)
  if cp < 0x80 then
    return string.char(cp)
  elseif cp < 0x800 then
    return string.char(0xC0 + math.floor(cp / 0x40), 0x80 + cp % 0x40)
  elseif cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 0x1000), 0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
  end
  return string.char(0xF0 + math.floor(cp / 0x40000), 0x80 + math.floor(cp / 0x1000) % 0x40,
    0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
end

local escapes = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

local function decode_string(s, i)
  -- s:sub(i, i) == '"'
  local out, j = {}, i + 1
  while true do
    local c = string.sub(s, j, j)
    if c == "" then
      fail("unterminated string at byte " .. i)
    elseif c == '"' then
      return table.concat(out), j + 1
    elseif c == "\\" then
      local e = string.sub(s, j + 1, j + 1)
      if e == "u" then
        local hex = string.sub(s, j + 2, j + 5)
        local cp = tonumber(hex, 16) or fail("bad \\u escape at byte " .. j)
        j = j + 6
        if cp >= 0xD800 and cp <= 0xDBFF and string.sub(s, j, j + 1) == "\\u" then
          local low = tonumber(string.sub(s, j + 2, j + 5), 16) or fail("bad surrogate at byte " .. j)
          cp = 0x10000 + (cp - 0xD800) * 0x400 + (low - 0xDC00)
          j = j + 6
        end
        out[#out + 1] = utf8_char(cp)
      else
        out[#out + 1] = escapes[e] or fail("bad escape \\" .. e .. " at byte " .. j)
        j = j + 2
      end
    else
      local k = string.find(s, '["\\]', j) or (#s + 1)
      out[#out + 1] = string.sub(s, j, k - 1)
      j = k
    end
  end
end

decode = function(s, i)
  i = skip(s, i)
  local c = string.sub(s, i, i)
  if c == "{" then
    local t = {}
    i = skip(s, i + 1)
    if string.sub(s, i, i) == "}" then
      return t, i + 1
    end
    while true do
      if string.sub(s, i, i) ~= '"' then
        fail("expected a key at byte " .. i)
      end
      local key
      key, i = decode_string(s, i)
      i = skip(s, i)
      if string.sub(s, i, i) ~= ":" then
        fail("expected ':' at byte " .. i)
      end
      local value
      value, i = decode(s, i + 1)
      t[key] = value -- a JSON null leaves the key absent, as in Argo CD
      i = skip(s, i)
      local d = string.sub(s, i, i)
      if d == "}" then
        return t, i + 1
      elseif d ~= "," then
        fail("expected ',' or '}' at byte " .. i)
      end
      i = skip(s, i + 1)
    end
  elseif c == "[" then
    local t, n = {}, 0
    i = skip(s, i + 1)
    if string.sub(s, i, i) == "]" then
      return t, i + 1
    end
    while true do
      local value
      value, i = decode(s, i)
      n = n + 1
      t[n] = value
      i = skip(s, i)
      local d = string.sub(s, i, i)
      if d == "]" then
        return t, i + 1
      elseif d ~= "," then
        fail("expected ',' or ']' at byte " .. i)
      end
      i = i + 1
    end
  elseif c == '"' then
    return decode_string(s, i)
  elseif string.sub(s, i, i + 3) == "true" then
    return true, i + 4
  elseif string.sub(s, i, i + 4) == "false" then
    return false, i + 5
  elseif string.sub(s, i, i + 3) == "null" then
    return nil, i + 4
  end
  local num = string.match(s, "^-?%d+%.?%d*[eE]?[-+]?%d*", i)
  if num == nil or num == "" then
    fail("unexpected character '" .. c .. "' at byte " .. i)
  end
  return tonumber(num) or fail("bad number " .. num), i + #num
end

-- ---- run the check ------------------------------------------------------------
local script = arg[1] or fail("usage: run-health.lua HEALTH_SCRIPT < object.json")
local input = io.read("*a")
local object, rest = decode(input, 1)
if type(object) ~= "table" then
  fail("stdin is not a JSON object")
end
if skip(input, rest) <= #input then
  fail("trailing data after the object at byte " .. rest)
end

local env = {
  obj = object,
  assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, pcall = pcall,
  select = select, tonumber = tonumber, tostring = tostring, type = type, unpack = unpack,
  string = string, table = table, math = math,
}
local file = io.open(script, "r") or fail("cannot read " .. script)
local source = file:read("*a")
file:close()

local chunk, err
if setfenv ~= nil then -- Lua 5.1
  chunk, err = loadstring(source, "@" .. script)
  if chunk ~= nil then
    setfenv(chunk, env)
  end
else -- Lua 5.2+
  chunk, err = load(source, "@" .. script, "t", env)
end
if chunk == nil then
  fail("cannot load " .. script .. ": " .. tostring(err))
end
local ok, hs = pcall(chunk)
if not ok then
  fail(script .. " failed: " .. tostring(hs))
end
if type(hs) ~= "table" or type(hs.status) ~= "string" then
  fail(script .. " did not return a table with a string `status`")
end
io.write(hs.status, "\t", tostring(hs.message or ""), "\n")
