//! Which rank runs on which node, from the host hashes every rank published at setup (the
//! bootstrap's `nranks_per_node` comes from the same hashes; `MSCCLPP_HOSTID` tells apart
//! "nodes" that share one machine, e.g. to emulate two nodes on one host).
//!
//! Nodes are numbered by their lowest rank; a rank's local index is its position among the
//! ranks of its node (ascending). The hierarchical algorithms pair rank (node m, local l) with
//! (node j, local l) across nodes ("rails"), so every node must hold the same number of ranks.

use crate::error::{Error, Result};

/// What the ranks agreed about their GPUs (identical on every rank; taken by the mesh
/// algorithms' first call outside capture, see `mesh::census`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Census {
    /// The most ranks that share one GPU.
    pub share: usize,
    /// The fewest multiprocessors of any rank's GPU.
    pub min_sms: u32,
}

/// The node layout of a world (identical on every rank).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Node of every rank.
    pub node_of: Vec<usize>,
    /// Local index of every rank inside its node.
    pub local_of: Vec<usize>,
    /// The ranks of every node, ascending (index = node).
    pub nodes: Vec<Vec<usize>>,
    /// Number of nodes.
    pub nnodes: usize,
    /// This rank's node.
    pub node: usize,
    /// This rank's local index.
    pub local: usize,
    /// The ranks of this node, ascending (this rank included).
    pub local_ranks: Vec<usize>,
}

impl Topology {
    /// The layout of the world whose rank r published `hosts[r]` (a host hash), seen by `rank`.
    /// Errors when nodes hold different numbers of ranks (the hierarchical algorithms pair
    /// ranks of equal local index across nodes).
    pub fn new(rank: usize, hosts: &[Vec<u8>]) -> Result<Topology> {
        let n = hosts.len();
        if rank >= n {
            return Err(Error::invalid(format!(
                "collectives topology: rank {rank}: expected a rank below {n}"
            )));
        }
        let mut keys: Vec<&[u8]> = Vec::new();
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        let mut node_of = vec![0; n];
        let mut local_of = vec![0; n];
        for (r, h) in hosts.iter().enumerate() {
            let m = match keys.iter().position(|k| *k == h.as_slice()) {
                Some(m) => m,
                None => {
                    keys.push(h);
                    nodes.push(Vec::new());
                    keys.len() - 1
                }
            };
            node_of[r] = m;
            local_of[r] = nodes[m].len();
            nodes[m].push(r);
        }
        let per = nodes[0].len();
        if let Some((m, ranks)) = nodes.iter().enumerate().find(|(_, v)| v.len() != per) {
            return Err(Error::invalid(format!(
                "collectives: expected the same number of ranks on every node (node 0 of ranks \
                 {:?} has {per}, node {m} of ranks {ranks:?} has {})",
                nodes[0],
                ranks.len()
            )));
        }
        let node = node_of[rank];
        Ok(Topology {
            local: local_of[rank],
            local_ranks: nodes[node].clone(),
            nnodes: nodes.len(),
            node,
            node_of,
            local_of,
            nodes,
        })
    }

    /// The rank of local index `l` on node `m`.
    pub fn rank_at(&self, m: usize, l: usize) -> usize {
        self.nodes[m][l]
    }

    /// Ranks per node.
    pub fn per_node(&self) -> usize {
        self.local_ranks.len()
    }

    /// This rank's peers on its node, starting after it (the order the algorithms visit them).
    pub fn local_peers(&self) -> impl Iterator<Item = usize> + '_ {
        let l = self.per_node();
        (1..l).map(move |q| self.local_ranks[(self.local + q) % l])
    }

    /// This rank's rail peers: the ranks of its local index on the other nodes, in node order
    /// starting after its own node.
    pub fn rail_peers(&self) -> impl Iterator<Item = usize> + '_ {
        let m = self.nnodes;
        (1..m).map(move |q| self.rank_at((self.node + q) % m, self.local))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_nodes() {
        let hosts: Vec<Vec<u8>> = [1u8, 2, 1, 2].iter().map(|h| vec![*h]).collect();
        let t = Topology::new(3, &hosts).unwrap();
        assert_eq!(t.nnodes, 2);
        assert_eq!(t.nodes, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!((t.node, t.local), (1, 1));
        assert_eq!(t.local_peers().collect::<Vec<_>>(), vec![1]);
        assert_eq!(t.rail_peers().collect::<Vec<_>>(), vec![2]);
        let one = Topology::new(0, &hosts[..1]).unwrap();
        assert_eq!((one.nnodes, one.per_node()), (1, 1));
        assert_eq!(one.rail_peers().count(), 0);
    }

    #[test]
    fn uneven_nodes_and_bad_rank() {
        let hosts: Vec<Vec<u8>> = [1u8, 1, 2].iter().map(|h| vec![*h]).collect();
        let e = Topology::new(0, &hosts).unwrap_err().to_string();
        assert!(e.contains("same number of ranks"), "{e}");
        assert!(Topology::new(5, &hosts[..2]).is_err());
    }
}
