// One verdict per group on the detection page (`openstamp detect --group-by`): the records of a .jsonl file
// are grouped by a field's value, and each group goes to POST /v1/detect as one pooled set (pool.js's
// scoreSet), one request each, shown as one row of a table. Each group is its own test.
"use strict";

// Record indices by group value, in order of first appearance; 1 and "1" are different values, as in Python.
function groupIndices(values) {
  const groups = new Map();
  values.forEach((value, i) => {
    const id = JSON.stringify(value);
    if (!groups.has(id)) groups.set(id, { label: String(value), rows: [] });
    groups.get(id).rows.push(i);
  });
  return [...groups.values()];
}

async function detectGroups(groupBy, set) {
  const groups = groupIndices(set.groups);
  const scored = [];
  let keyId = "";
  for (const [n, group] of groups.entries()) {
    say("Scoring group " + (n + 1) + " of " + groups.length + " (" + group.rows.length + " texts)…", false);
    const texts = group.rows.map((i) => set.texts[i]);
    const answer = await scoreSet(texts, group.rows.map((i) => set.prompts[i]), groupBy + " " + group.label + ": ");
    if (answer.error) return say(answer.error, true);
    scored.push({ label: group.label, result: answer.result });
    keyId = answer.keyId;
  }
  say("", false);
  showGroups(groupBy, scored, keyId);
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.append(td);
}

// One row per group: its value, texts, tokens, pooled p-value and verdict; each group is its own test.
function showGroups(groupBy, scored, keyId) {
  const body = $("groups").tBodies[0];
  body.replaceChildren();
  let flagged = 0;
  scored.forEach(({ label, result }) => {
    const row = document.createElement("tr");
    const short = result.status === "too_short";
    flagged += result.decision === true ? 1 : 0;
    cell(row, label);
    cell(row, String(result.n_texts));
    cell(row, String(result.n_tokens));
    cell(row, short || result.p_value === null ? "-" : Number(result.p_value).toPrecision(3));
    cell(row, short ? "too few tokens" : result.decision === true ? "flagged" : result.decision === false ?
      "not flagged" : "no decision");
    if (result.decision === true) row.className = "flagged";
    body.append(row);
  });
  $("groups-head").textContent = groupBy;
  const alpha = info ? info.decision.alpha : "alpha";
  $("groups-note").textContent = flagged + " of " + scored.length + " groups flagged, key " + keyId + ". Each " +
    "group is its own test at a false-positive rate of " + alpha + ": of many groups of human text, that " +
    "share is flagged by chance.";
  $("group-results").hidden = false;
}
