//! Text for people: a node's merged fence plan, fire-drill results and step results.
//! Credentials are masked by the types themselves; nothing here can print one.

use std::fmt::Write;

use super::AgentCheck;
use super::config::{FencePlan, Layer, MethodPlan, StepPlan};
use super::runner::ProbeResult;
use super::step::StepResult;

/// The whole plan: per step, each alternative, each method with its merged parameters
/// and where each value came from.
pub fn render_plan(plan: &FencePlan, check: Option<&AgentCheck>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Fence plan for node {} (ConfigMap {})",
        plan.node, plan.config_map
    );
    for step in &plan.steps {
        out.push('\n');
        render_step_plan(&mut out, step);
    }
    if plan.kdump {
        out.push_str(
            "\nkdump: on. The node's crash kernel notifications (fence_kdump_send, from its InternalIP) release its pods, and its power step waits while it dumps.\n",
        );
    }
    if !plan.warnings.is_empty() {
        out.push_str("\nWarnings:\n");
        for warning in &plan.warnings {
            let _ = writeln!(out, "  {warning}");
        }
    }
    if let Some(check) = check {
        if !check.not_installed.is_empty() {
            let _ = writeln!(
                out,
                "\nNot installed here, so their parameters were not checked: {}",
                check.not_installed.join(", ")
            );
        }
        for (agent, reason) in &check.unreadable {
            let _ = writeln!(out, "\nCould not read the metadata of {agent}: {reason}");
        }
    }
    out
}

/// One step of the plan.
pub fn render_step_plan(out: &mut String, step: &StepPlan) {
    let _ = writeln!(out, "{}:", step.step);
    let several = step.alternatives.len() > 1;
    for (index, alternative) in step.alternatives.iter().enumerate() {
        let indent = if several {
            let how = if index == 0 {
                "tried first"
            } else {
                "if the one before failed"
            };
            let _ = writeln!(out, "  alternative {} ({how}):", index + 1);
            "    "
        } else {
            "  "
        };
        for method in &alternative.methods {
            render_method(out, indent, method);
        }
    }
}

fn render_method(out: &mut String, indent: &str, method: &MethodPlan) {
    let template = method
        .template
        .as_deref()
        .map(|t| format!(", template {t}"))
        .unwrap_or_default();
    let optional = if method.must_succeed {
        ""
    } else {
        " (may fail: must_sucess=no)"
    };
    let _ = writeln!(
        out,
        "{indent}method {}: {} {}{optional}  [{}{template}]",
        method.name, method.agent, method.action, method.source.config_map
    );
    let action_origin = match method.action_layer {
        Layer::Default => "default for the step".to_string(),
        layer => layer.to_string(),
    };
    let mut rows = vec![(
        "action".to_string(),
        method.action.to_string(),
        action_origin,
    )];
    for parameter in &method.parameters {
        let origin = match &parameter.secret {
            Some(secret) => format!(
                "{} (Secret {}, key {})",
                parameter.layer, secret.secret, secret.key
            ),
            None => parameter.layer.to_string(),
        };
        rows.push((
            parameter.name.clone(),
            parameter.value.shown().to_string(),
            origin,
        ));
    }
    let name_width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let value_width = rows.iter().map(|r| r.1.chars().count()).max().unwrap_or(0);
    for (name, value, origin) in rows {
        let _ = writeln!(
            out,
            "{indent}    {name:<name_width$}  {value:<value_width$}  {origin}"
        );
    }
}

/// The fire drill's table: one row per method.
pub fn render_probe(results: &[ProbeResult]) -> String {
    let mut rows = vec![[
        "METHOD".to_string(),
        "AGENT".to_string(),
        "ACTION".to_string(),
        "DEVICE".to_string(),
        "POWER".to_string(),
        "TIME".to_string(),
        "DETAIL".to_string(),
    ]];
    for result in results {
        let device = if result.ok {
            "ok: reachable, credentials accepted"
        } else {
            "FAILED"
        };
        let detail = if result.ok {
            String::new()
        } else {
            result.call.summary()
        };
        rows.push([
            result.method.clone(),
            result.agent.clone(),
            result.action.clone(),
            device.to_string(),
            result
                .power
                .map_or_else(|| "-".to_string(), |power| power.to_string()),
            format!("{:.2}s", result.call.duration.as_secs_f64()),
            detail,
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (index, (cell, width)) in row.iter().zip(widths).enumerate() {
            if index + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// What a step did, method by method.
pub fn render_step_result(node: &str, result: &StepResult) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} on node {node}:", result.step);
    for alternative in &result.alternatives {
        let _ = writeln!(
            out,
            "  alternative {}: {}",
            alternative.alternative,
            if alternative.succeeded {
                "succeeded"
            } else {
                "failed"
            }
        );
        for method in &alternative.methods {
            let verdict = if method.succeeded { "ok" } else { "FAILED" };
            let confirmation = if method.off_confirmed {
                ", OFF confirmed by status"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "    {} ({} {}): {verdict}{confirmation} in {:.2}s",
                method.method,
                method.agent,
                method.action,
                method.duration.as_secs_f64()
            );
            if let Some(detail) = &method.detail {
                let _ = writeln!(out, "      {detail}");
            }
            for call in &method.calls {
                let power = call
                    .power
                    .map(|p| format!(", power {p}"))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "      {} {}: {}{power} ({:.2}s)",
                    call.agent,
                    call.action,
                    call.summary(),
                    call.duration.as_secs_f64()
                );
            }
        }
    }
    let verdict = match (result.succeeded, result.off_confirmed) {
        (false, _) => "FAILED: no alternative succeeded",
        (true, _) if result.step == super::config::Step::Recovery => "succeeded",
        (true, true) => "succeeded; OFF confirmed by status",
        (true, false) => "succeeded, but not every off was confirmed by status",
    };
    let _ = writeln!(out, "Step {} {verdict}.", result.step);
    out
}
