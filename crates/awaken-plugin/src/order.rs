//! The one plugin order: a stable topological sort of the given list by
//! `depends_on`, where among plugins whose dependencies are all placed, higher `priority` goes
//! first and equal priority keeps list order.

use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;

use crate::error::EnvError;
use crate::plugin::Plugin;

/// Orders `plugins` (already filtered to enabled ones). Errors: a duplicate id, a dependency
/// not in the list, a cycle (naming its members).
pub fn execution_order(plugins: &[Arc<dyn Plugin>]) -> Result<Vec<Arc<dyn Plugin>>, EnvError> {
    if plugins.len() <= FEW_PLUGINS && plugins.iter().all(|p| p.manifest().depends_on.is_empty()) {
        // A few plugins without dependencies (every run resolves its agent's, the built-ins
        // among them): the duplicate check compares ids pairwise, no index is built.
        for (i, p) in plugins.iter().enumerate() {
            let id = &p.manifest().id;
            if plugins[..i].iter().any(|q| q.manifest().id == *id) {
                return Err(EnvError::DuplicatePlugin {
                    plugin_id: id.clone(),
                });
            }
        }
        return Ok(by_priority(plugins));
    }
    let mut index: HashMap<&str, usize, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(plugins.len(), Default::default());
    for (i, p) in plugins.iter().enumerate() {
        if index.insert(p.manifest().id.as_str(), i).is_some() {
            return Err(EnvError::DuplicatePlugin {
                plugin_id: p.manifest().id.clone(),
            });
        }
    }
    for p in plugins {
        for dep in &p.manifest().depends_on {
            if !index.contains_key(dep.as_str()) {
                return Err(EnvError::MissingDependency {
                    plugin_id: p.manifest().id.clone(),
                    missing: dep.clone(),
                });
            }
        }
    }
    let n = plugins.len();
    if plugins.iter().all(|p| p.manifest().depends_on.is_empty()) {
        return Ok(by_priority(plugins));
    }
    // Kahn's algorithm: a plugin is ready once every dependency is placed; the ready one with
    // the highest priority goes next, ties in list order (a heap keyed on both).
    let mut unplaced_deps = vec![0usize; n];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, p) in plugins.iter().enumerate() {
        for dep in &p.manifest().depends_on {
            unplaced_deps[i] += 1;
            dependents[index[dep.as_str()]].push(i);
        }
    }
    let key = |i: usize| (plugins[i].manifest().priority, std::cmp::Reverse(i));
    let mut ready: BinaryHeap<_> = (0..n).filter(|&i| unplaced_deps[i] == 0).map(key).collect();
    let mut placed = vec![false; n];
    let mut order = Vec::with_capacity(n);
    while let Some((_, std::cmp::Reverse(i))) = ready.pop() {
        placed[i] = true;
        order.push(plugins[i].clone());
        for &k in &dependents[i] {
            unplaced_deps[k] -= 1;
            if unplaced_deps[k] == 0 {
                ready.push(key(k));
            }
        }
    }
    if order.len() < n {
        return Err(EnvError::DependencyCycle {
            members: find_cycle(plugins, &index, &placed),
        });
    }
    Ok(order)
}

/// Up to this many plugins without dependencies are checked for duplicates pairwise.
const FEW_PLUGINS: usize = 8;

/// Plugins without dependencies in their order: Kahn's order is then the list sorted by
/// priority, highest first, ties in list order — a stable sort gives it directly.
fn by_priority(plugins: &[Arc<dyn Plugin>]) -> Vec<Arc<dyn Plugin>> {
    let mut order: Vec<Arc<dyn Plugin>> = plugins.to_vec();
    order.sort_by_key(|p| std::cmp::Reverse(p.manifest().priority));
    order
}

/// Walks dependencies from the first unplaced plugin until a plugin repeats; returns that cycle.
fn find_cycle(
    plugins: &[Arc<dyn Plugin>],
    index: &HashMap<&str, usize, foldhash::fast::RandomState>,
    placed: &[bool],
) -> Vec<String> {
    let Some(start) = (0..plugins.len()).find(|&i| !placed[i]) else {
        return Vec::new();
    };
    let mut path: Vec<usize> = vec![start];
    let mut seen: BTreeSet<usize> = BTreeSet::from([start]);
    let mut current = start;
    loop {
        // Follow the first unplaced dependency (every unplaced plugin has one, or it would be ready).
        let Some(next) = plugins[current]
            .manifest()
            .depends_on
            .iter()
            .map(|d| index[d.as_str()])
            .find(|&j| !placed[j])
        else {
            return path
                .iter()
                .map(|&i| plugins[i].manifest().id.clone())
                .collect();
        };
        if !seen.insert(next) {
            let from = path.iter().position(|&i| i == next).unwrap_or(0);
            let mut members: Vec<String> = path[from..]
                .iter()
                .map(|&i| plugins[i].manifest().id.clone())
                .collect();
            members.push(plugins[next].manifest().id.clone());
            return members;
        }
        path.push(next);
        current = next;
    }
}
