//! BroadcastTest: every registered broadcast algorithm x data type x in/out of place x sizes
//! that are not multiples of the vector width or the rank count, against the host reference
//! (exact for integers), with poisoned outputs and a guard zone (coll_matrix.rs), plus the
//! world-size-1 copy and 1000 repeated calls with changing data (100 above
//! `coll_common::FULL_MATRIX_MAX_RANKS` ranks).

use mscclpp::collectives::CollectiveKind;
use mscclpp_framework::*;

use super::coll_matrix::kind_suite;

kind_suite!(BroadcastTest, CollectiveKind::Broadcast);
