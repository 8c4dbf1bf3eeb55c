#include "opguard/aligner/align.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace opguard::aligner {
namespace {

using testing::Lane;

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s + " ";
  return out;
}

TEST(AlignLane, OpsOfAnEditedLinePairAcrossIt) {
  // The suspect's line of B and C was edited (other text: other keys); A and
  // D around it pair by key, B and C by loose key, in order. X only exists in
  // the suspect and stays unaligned.
  auto r = Lane("A0 A1 A2 A3 A4 A5 A6 A7 A8 B C D0 D1 D2 D3 D4 D5 D6 D7 D8");
  auto s = Lane("A0 A1 A2 A3 A4 A5 A6 A7 A8 B@2 X C@2 D0 D1 D2 D3 D4 D5 D6 D7 D8");
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), 20u);
  EXPECT_EQ(a.changed_site, 2u);
  EXPECT_EQ(a.pairs[9].sus, 9u);  // B - B@2
  EXPECT_EQ(a.pairs[9].flags, Pair::kChangedSite);
  EXPECT_EQ(a.pairs[10].sus, 11u);  // C - C@2, past X
  EXPECT_EQ(a.pairs[11].sus, 12u);  // D0
  EXPECT_EQ(a.pairs[11].flags, 0u);
  ASSERT_EQ(a.notes.size(), 1u);
  EXPECT_NE(a.notes[0].find("edited source lines"), std::string::npos);
}

TEST(AlignLane, OneLineRunForIndependentDataInAnotherOrderPairsByData) {
  // A helper called from one line projects q, k and v (one key for all
  // three); the suspect issues k before q. Structure alone pairs q with k.
  auto r = Lane("A B C L=q#q L=k#k L=v#v D E F G H I J K");
  auto s = Lane("A B C L=k#k L=q#q L=v#v D E F G H I J K");
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), 14u);
  EXPECT_EQ(a.by_data, 2u);
  EXPECT_EQ(a.pairs[3].sus, 4u);  // q - q
  EXPECT_EQ(a.pairs[4].sus, 3u);  // k - k
  EXPECT_EQ(a.pairs[5].sus, 5u);  // v kept
  EXPECT_EQ(a.pairs[3].flags & Pair::kByData, Pair::kByData);
  EXPECT_EQ(a.reordered, 1u);  // k, before q in the suspect
  for (const Pair& p : a.pairs) EXPECT_EQ(r.ops[p.ref].outputs, s.ops[p.sus].outputs);
  EXPECT_FALSE(a.degraded);
}

TEST(AlignLane, TheSameMathOnOtherLinesPairsByItsInputs) {
  // The suspect runs the update in another function (other sites, so other
  // keys), in another order: the loose key alone would pair one of them in
  // order; the inputs pair both with what they replaced.
  auto r = Lane("A B C U@1=g#g V@1=h#h D E F G H I J");
  auto s = Lane("A B C V@2=h#h U@2=g#g D E F G H I J");
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), 12u);
  EXPECT_EQ(a.by_data, 2u);
  EXPECT_EQ(a.pairs[3].sus, 4u);
  EXPECT_EQ(a.pairs[4].sus, 3u);
}

TEST(AlignLane, APairOnEqualInputsIsNeverUndone) {
  // The suspect ran the op twice, the first time wrongly: the pair with equal
  // inputs and different outputs stands (the op itself diverged), however
  // well the second run of it would match.
  auto r = Lane("A B C L=q D E F G H I J");
  auto s = Lane("A B C L=q#bad L=q D E F G H I J");
  Alignment a = AlignLane(r.ops, s.ops);
  EXPECT_EQ(a.by_data, 0u);
  ASSERT_EQ(a.pairs.size(), 11u);
  EXPECT_EQ(a.pairs[3].sus, 3u);
  EXPECT_NE(r.ops[3].outputs, s.ops[3].outputs);
}

TEST(AlignLane, APairOnEqualOutputsIsNeverUndone) {
  // In-place initialisers read uninitialised memory: their inputs differ
  // from run to run, their outputs do not. A neighbour that happens to read
  // the same garbage is no better partner.
  auto r = Lane("A B C U=x U=y D E F G H I J");
  auto s = Lane("A B C U=y U=z D E F G H I J");
  Alignment a = AlignLane(r.ops, s.ops);
  EXPECT_EQ(a.by_data, 0u);
  ASSERT_EQ(a.pairs.size(), 12u);
  EXPECT_EQ(a.pairs[3].sus, 3u);
  EXPECT_EQ(a.pairs[4].sus, 4u);
}

TEST(AlignLane, InsertedOpsWithoutACounterpartStayUnaligned) {
  // Ops only one side has (logging) never pair loosely: the other side has
  // nothing left between the same two pairs.
  auto r = Lane("A B C D E F");
  auto s = Lane("A B N@1 N@2 C D E F");
  Alignment a = AlignLane(r.ops, s.ops);
  EXPECT_EQ(a.pairs.size(), 6u);
  EXPECT_EQ(a.changed_site, 0u);
}

TEST(AlignLane, IdenticalUsesFastPathOnly) {
  auto r = Lane("A B C D E F G H I J");
  Alignment a = AlignLane(r.ops, r.ops);
  EXPECT_EQ(a.pairs.size(), 10u);
  EXPECT_EQ(a.windows, 0u);
  EXPECT_FALSE(a.degraded);
}

TEST(AlignLane, InsertionAtStartMiddleEnd) {
  auto r = Lane("A B C D E F G H I J K L");
  auto s = Lane("X A B C D E Y F G H I J K L Z");
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), 12u);
  EXPECT_EQ(a.pairs[0].sus, 1u);   // A
  EXPECT_EQ(a.pairs[5].sus, 7u);   // F after Y
  EXPECT_EQ(a.pairs[11].sus, 13u); // L before Z
  EXPECT_EQ(a.reordered, 0u);
}

TEST(AlignLane, DeletionIsInsertionInTheReference) {
  auto r = Lane("A B C Q D E F G H I J K");
  auto s = Lane("A B C D E F G H I J K");
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), 11u);
  EXPECT_EQ(a.pairs[3].ref, 4u);
  EXPECT_EQ(a.pairs[3].sus, 3u);
}

TEST(AlignLane, LocalReorderIsRescued) {
  auto r = Lane("A B Q K V O D E F G H I J");
  auto s = Lane("A B Q V K O D E F G H I J");
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), 13u);
  EXPECT_EQ(a.reordered, 1u);
  // Sorted by reference position; K pairs with K, V with V.
  EXPECT_EQ(a.pairs[3].ref, 3u);
  EXPECT_EQ(a.pairs[3].sus, 4u);
  EXPECT_EQ(a.pairs[4].ref, 4u);
  EXPECT_EQ(a.pairs[4].sus, 3u);
}

TEST(AlignLane, ReorderOfThreeOps) {
  auto r = Lane("A B Q K V W O D E F G H I J");
  auto s = Lane("A B Q W K V O D E F G H I J");
  Alignment a = AlignLane(r.ops, s.ops);
  EXPECT_EQ(a.pairs.size(), 14u);
  for (const Pair& p : a.pairs) EXPECT_EQ(r.ops[p.ref].key, s.ops[p.sus].key);
}

TEST(AlignLane, RepeatedIdenticalLayersPickTheNearestCopy) {
  std::string layer = "ln q k v attn proj ln2 fc1 act fc2";
  auto r = Lane(Repeat(layer, 30));
  // One extra op inside layer 12: everything else must pair with its own layer.
  std::string sus;
  for (int i = 0; i < 30; ++i) sus += (i == 12 ? "ln q k v EXTRA attn proj ln2 fc1 act fc2 " : layer + " ");
  auto s = Lane(sus);
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), 300u);
  for (const Pair& p : a.pairs) {
    uint32_t expect = p.ref < 124 ? p.ref : p.ref + 1;
    EXPECT_EQ(p.sus, expect) << "ref " << p.ref;
  }
}

TEST(AlignLane, RepeatedLayerDroppedWholesale) {
  std::string layer = "ln q k v attn proj ln2 fc1 act fc2";
  auto r = Lane(Repeat(layer, 20));
  auto s = Lane(Repeat(layer, 19));
  Alignment a = AlignLane(r.ops, s.ops);
  EXPECT_EQ(a.pairs.size(), 190u);
}

TEST(AlignLane, LongInsertion) {
  std::string ins;
  for (int i = 0; i < 1000; ++i) ins += "I" + std::to_string(i) + " ";
  auto r = Lane("A B C D E F G H I J K L M N O P");
  auto s = Lane("A B C D E F G H " + ins + "I J K L M N O P");
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), 16u);
  EXPECT_EQ(a.pairs[8].sus, 1008u);
  EXPECT_FALSE(a.degraded);
}

TEST(AlignLane, UnrelatedRunsAreBoundedAndNoted) {
  std::string x, y;
  for (int i = 0; i < 3000; ++i) {
    x += "x" + std::to_string(i) + " ";
    y += "y" + std::to_string(i) + " ";
  }
  auto r = Lane(x), s = Lane(y);
  AlignOptions o;
  o.max_lookahead = 256;
  Alignment a = AlignLane(r.ops, s.ops, o);
  EXPECT_TRUE(a.pairs.empty());
  EXPECT_TRUE(a.degraded);
  EXPECT_FALSE(a.notes.empty());
}

TEST(AlignLane, OverBudgetWindowFallsBackButStillPairs) {
  auto r = Lane("A B P Q R C D E F G H I J K L");
  auto s = Lane("A B X R Q P Y C D E F G H I J K L");
  AlignOptions o;
  o.max_window_cells = 1;  // force the occurrence fallback
  Alignment a = AlignLane(r.ops, s.ops, o);
  EXPECT_EQ(a.pairs.size(), 15u);
  EXPECT_TRUE(a.degraded);
}

// "L=p0#p0 L=p1#p1 ...": one line applying op L to `count` tensors of one
// shape (a loop over parameters); each output is its own.
std::string Loop(const std::string& op, const std::string& data, int from, int count) {
  std::string out;
  for (int i = from; i < from + count; ++i) {
    out += op + "=" + data + std::to_string(i) + "#" + data + std::to_string(i) + " ";
  }
  return out;
}

TEST(AlignLane, ALoopOverParametersPairsByDataPastHundredsOfLikeOps) {
  // The suspect's benign change (a gradient-norm log, other FSDP splits)
  // runs the loop's line over 300 more tensors of the same shape first: in
  // order, structure pairs every parameter's op with another tensor's, 300
  // ops away from its own. Equal inputs identify each occurrence however far.
  const std::string head = "A B C D E F G H ";
  const std::string tail = "S T U V W X Y Z";
  auto r = Lane(head + Loop("L", "p", 0, 200) + tail);
  auto s = Lane(head + Loop("L", "x", 0, 300) + Loop("L", "p", 0, 200) + tail);
  Alignment a = AlignLane(r.ops, s.ops);
  size_t loop_pairs = 0;
  for (const Pair& p : a.pairs) {
    EXPECT_EQ(r.ops[p.ref].outputs, s.ops[p.sus].outputs) << "ref " << p.ref << " with sus " << p.sus;
    if (p.ref >= 8 && p.ref < 208) {
      EXPECT_EQ(p.sus, p.ref + 300) << "ref " << p.ref;
      ++loop_pairs;
    }
  }
  EXPECT_EQ(loop_pairs, 200u);
}

TEST(AlignLane, ALoopOfSeveralOpsPerParameterPairsEachOccurrenceByData) {
  // A hand-written per-parameter update (mul_, add_ per parameter, one line
  // each); the suspect's extra pass runs the same two lines over 150 other
  // tensors first.
  std::string ref_loop, extra;
  for (int i = 0; i < 100; ++i) {
    const std::string k = std::to_string(i);
    ref_loop += "M=p" + k + "#m" + k + " N=m" + k + "#n" + k + " ";
  }
  for (int i = 0; i < 150; ++i) {
    const std::string k = std::to_string(i);
    extra += "M=g" + k + "#gm" + k + " N=gm" + k + "#gn" + k + " ";
  }
  auto r = Lane("A B C D E F G H " + ref_loop + "S T U V W X Y Z");
  auto s = Lane("A B C D E F G H " + extra + ref_loop + "S T U V W X Y Z");
  Alignment a = AlignLane(r.ops, s.ops);
  EXPECT_EQ(a.pairs.size(), r.ops.size());
  for (const Pair& p : a.pairs) {
    EXPECT_EQ(r.ops[p.ref].outputs, s.ops[p.sus].outputs) << "ref " << p.ref << " with sus " << p.sus;
  }
}

TEST(AlignLane, ALoopRunTwiceAsOftenOnRepeatedValuesLeavesTheExtraOpsUnpaired) {
  // FSDP2's init chunks every parameter twice in the reference and once in
  // the suspect (reshard_after_forward=False); LayerNorm weights are all
  // ones and biases all zeros in every layer, so equal inputs do not say
  // which occurrence is which. No pair may compare a weight with a bias.
  std::string ref_loop, sus_loop;
  for (int layer = 0; layer < 12; ++layer) {
    const std::string w = "C=w" + std::to_string(layer) + "#w" + std::to_string(layer);
    for (const std::string& op : {std::string("C=one#one"), std::string("C=zero#zero"), w}) {
      ref_loop += op + " " + op + " ";
      sus_loop += op + " ";
    }
  }
  auto r = Lane("A B C D E F G H " + ref_loop + "S T U V W X Y Z");
  auto s = Lane("A B C D E F G H " + sus_loop + "S T U V W X Y Z");
  Alignment a = AlignLane(r.ops, s.ops);
  EXPECT_EQ(a.pairs.size(), s.ops.size());
  for (const Pair& p : a.pairs) {
    EXPECT_EQ(r.ops[p.ref].outputs, s.ops[p.sus].outputs) << "ref " << p.ref << " with sus " << p.sus;
  }
}

TEST(AlignLane, AnOpCalledWithOtherScalarsPairsWithWhatItReplaced) {
  // The suspect's line passes another argument (scale=...): another site,
  // another structural key, other inputs and outputs, the same tensors'
  // loose key (trace.h). It pairs with the op it replaced between the same
  // two pairs, flagged, so its own outputs are the evidence instead of its
  // consumer's (T, whose inputs then differ).
  auto r = Lane("A0 A1 A2 A3 A4 A5 A6 A7 A8 Q K SDPA T D0 D1 D2 D3 D4 D5 D6 D7 D8");
  auto s = Lane("A0 A1 A2 A3 A4 A5 A6 A7 A8 Q K SDPA T#t2 D0 D1 D2 D3 D4 D5 D6 D7 D8");
  OpEvent& edited = s.ops[11];
  edited.key ^= 0x5ca1e;
  edited.site ^= 0x5ca1e;
  edited.inputs.lo ^= 0x5ca1e;
  edited.outputs.lo ^= 0x5ca1e;
  Alignment a = AlignLane(r.ops, s.ops);
  ASSERT_EQ(a.pairs.size(), r.ops.size());
  EXPECT_EQ(a.pairs[11].sus, 11u);
  EXPECT_EQ(a.pairs[11].flags & Pair::kChangedSite, Pair::kChangedSite);
  EXPECT_EQ(a.changed_site, 1u);
}

TEST(OpEventKeys, AnotherScalarArgumentKeepsTheLooseKeyOnly) {
  // F.scaled_dot_product_attention(q, k, v) against (q, k, v, scale=0.3):
  // the argument list differs in kind (None, then a double) and value.
  OpDetail d;
  d.name = 0x5d9a;
  TensorInfo t;
  t.dtype = DType::kFloat32;
  t.shape = {2, 4, 8, 16};
  for (int i = 0; i < 3; ++i) {
    InputValue v;
    v.kind = ValueKind::kTensor;
    v.tensor = t;
    d.inputs.push_back(v);
  }
  d.inputs.emplace_back();  // scale=None
  d.outputs.push_back(t);
  OpDetail scaled = d;
  scaled.inputs.back().kind = ValueKind::kScalar;
  scaled.inputs.back().scalar_dtype = DType::kFloat64;
  scaled.inputs.back().scalar_bits = 0x3fd3333333333333ULL;
  const OpEvent a = MakeOpEvent(d), b = MakeOpEvent(scaled);
  EXPECT_NE(a.key, b.key);
  EXPECT_EQ(a.loose_key, b.loose_key);
  // Other tensor shapes are another loose key.
  OpDetail wider = d;
  wider.outputs[0].shape = {2, 4, 8, 32};
  EXPECT_NE(MakeOpEvent(wider).loose_key, a.loose_key);
}

TEST(AlignLane, OpsOfAnotherNameNeverPairAcrossAnEdit) {
  auto r = Lane("A0 A1 A2 A3 A4 A5 A6 A7 A8 Q D0 D1 D2 D3 D4 D5 D6 D7 D8");
  auto s = Lane("A0 A1 A2 A3 A4 A5 A6 A7 A8 R D0 D1 D2 D3 D4 D5 D6 D7 D8");
  Alignment a = AlignLane(r.ops, s.ops);
  EXPECT_EQ(a.pairs.size(), r.ops.size() - 1);
  EXPECT_EQ(a.changed_site, 0u);
}

TEST(AlignLane, EmptyInputs) {
  auto r = Lane("A B C");
  LaneTrace e;
  EXPECT_TRUE(AlignLane(r.ops, e.ops).pairs.empty());
  EXPECT_TRUE(AlignLane(e.ops, r.ops).pairs.empty());
}

}  // namespace
}  // namespace opguard::aligner
