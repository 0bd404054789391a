//! Delegation cycles among the registered agents: each group of agents that reach each other
//! through their `delegates` (a strongly connected group of the delegation graph), named by its
//! shortest cycle through the group's first agent. An agent delegating to itself is an invalid
//! spec, not a cycle here; an endpoint-backed agent's delegates are not run by this runtime,
//! so they are no edges.

use std::collections::VecDeque;

use crate::error::ValidationWarning;
use crate::registries::Registries;

/// One [`ValidationWarning::DelegationCycle`] per group of agents that delegate to each other
/// in a circle, in the order of the groups' first agent ids.
pub(crate) fn delegation_cycles(registries: &Registries) -> Vec<ValidationWarning> {
    let ids = registries.agent_ids();
    let edges = delegation_edges(registries, &ids);
    strongly_connected(&edges)
        .into_iter()
        .map(|group| {
            let cycle = shortest_cycle(&edges, &group);
            ValidationWarning::DelegationCycle {
                cycle: cycle.iter().map(|&i| ids[i].clone()).collect(),
                agents: group.iter().map(|&i| ids[i].clone()).collect(),
            }
        })
        .collect()
}

/// For each agent of `ids` (by index), the registered agents it delegates to, in the order its
/// spec lists them, each once.
fn delegation_edges(registries: &Registries, ids: &[String]) -> Vec<Vec<usize>> {
    ids.iter()
        .map(|id| {
            let mut to = Vec::new();
            let Some(spec) = registries.agent(id) else {
                return to;
            };
            if spec.endpoint.is_some() {
                return to;
            }
            for delegate in &spec.delegates {
                // `ids` is sorted: a registered delegate is found by binary search.
                if let Ok(i) = ids.binary_search(delegate)
                    && ids[i] != *id
                    && !to.contains(&i)
                {
                    to.push(i);
                }
            }
            to
        })
        .collect()
}

/// The strongly connected groups of more than one node (Tarjan's algorithm, with an explicit
/// stack so a long chain of agents cannot exhaust the thread's stack), each sorted, in the order
/// of their first node.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = edges.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut groups = Vec::new();
    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        // The path being explored: each node with the position of its next edge to follow.
        let mut path = vec![(root, 0usize)];
        while let Some(top) = path.last_mut() {
            let v = top.0;
            let edge = edges[v].get(top.1).copied();
            top.1 += 1;
            match edge {
                Some(w) if index[w] == UNSEEN => {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    path.push((w, 0));
                }
                Some(w) => {
                    if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                }
                None => {
                    path.pop();
                    if let Some(&(parent, _)) = path.last() {
                        low[parent] = low[parent].min(low[v]);
                    }
                    if low[v] == index[v] {
                        let mut group = Vec::new();
                        while let Some(w) = stack.pop() {
                            on_stack[w] = false;
                            group.push(w);
                            if w == v {
                                break;
                            }
                        }
                        if group.len() > 1 {
                            group.sort_unstable();
                            groups.push(group);
                        }
                    }
                }
            }
        }
    }
    groups.sort_unstable_by_key(|g| g[0]);
    groups
}

/// The shortest cycle through `group`'s first node, inside the group (breadth first, edges in
/// their listed order), without repeating that node at the end.
fn shortest_cycle(edges: &[Vec<usize>], group: &[usize]) -> Vec<usize> {
    let start = group[0];
    let mut came_from = vec![None; edges.len()];
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in &edges[v] {
            if w == start {
                let mut cycle = vec![v];
                let mut at = v;
                while let Some(p) = came_from[at] {
                    cycle.push(p);
                    at = p;
                }
                cycle.reverse();
                return cycle;
            }
            if came_from[w].is_none() && group.binary_search(&w).is_ok() {
                came_from[w] = Some(v);
                queue.push_back(w);
            }
        }
    }
    // Every node of a strongly connected group lies on a cycle through each other node.
    group.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_cycles_of_a_small_graph() {
        // 0 ⇄ 1; 2 → 3 → 4 → 2 with a shortcut 3 → 2; 5 alone; 4 → 5.
        let edges = vec![vec![1], vec![0], vec![3], vec![4, 2], vec![2, 5], vec![]];
        let groups = strongly_connected(&edges);
        assert_eq!(groups, vec![vec![0, 1], vec![2, 3, 4]]);
        assert_eq!(shortest_cycle(&edges, &groups[0]), vec![0, 1]);
        assert_eq!(shortest_cycle(&edges, &groups[1]), vec![2, 3]);
    }

    #[test]
    fn a_long_chain_has_no_group_and_a_long_ring_is_one() {
        let n = 100_000;
        let chain: Vec<Vec<usize>> = (0..n)
            .map(|i| if i + 1 < n { vec![i + 1] } else { vec![] })
            .collect();
        assert!(strongly_connected(&chain).is_empty());
        let ring: Vec<Vec<usize>> = (0..n).map(|i| vec![(i + 1) % n]).collect();
        let groups = strongly_connected(&ring);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].len(), n);
        assert_eq!(shortest_cycle(&ring, &groups[0]).len(), n);
    }
}
