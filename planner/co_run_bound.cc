#include "planner/co_run_bound.h"

#include <algorithm>
#include <cmath>

namespace dhelix {

namespace {

using Vec3 = std::array<double, 3>;
using RateMatrix = std::array<std::array<double, 3>, 3>;

// The constraint rows of the dual: one per non-empty stream set S (bit s of `set`),
// row[s] = rho(s, S) for s in S, else 0. The right-hand side is 1.
std::vector<Vec3> constraint_rows(const RateMatrix& r) {
  std::vector<Vec3> rows;
  for (int set = 1; set < 8; ++set) {
    Vec3 row{};
    for (int s = 0; s < 3; ++s) {
      if (((set >> s) & 1) == 0) continue;
      row[s] = 1;
      for (int o = 0; o < 3; ++o) {
        if (o != s && ((set >> o) & 1) != 0) row[s] *= r[s][o];
      }
    }
    rows.push_back(row);
  }
  return rows;
}

double dot(const Vec3& a, const Vec3& b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

double det3(const Vec3& a, const Vec3& b, const Vec3& c) {
  return a[0] * (b[1] * c[2] - b[2] * c[1]) - a[1] * (b[0] * c[2] - b[2] * c[0]) +
         a[2] * (b[0] * c[1] - b[1] * c[0]);
}

// The point where three hyperplanes (row . x = rhs) meet, by Cramer's rule; false when
// they do not meet in one point.
bool intersect(const std::array<Vec3, 3>& rows, const Vec3& rhs, Vec3* x) {
  const double d = det3(rows[0], rows[1], rows[2]);
  if (std::abs(d) < 1e-12) return false;
  for (int k = 0; k < 3; ++k) {
    std::array<Vec3, 3> m = rows;
    for (int i = 0; i < 3; ++i) m[i][k] = rhs[i];
    (*x)[k] = det3(m[0], m[1], m[2]) / d;
  }
  return true;
}

}  // namespace

CoRunLoadBound::CoRunLoadBound() : vertices_{{{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}}, count_(3) {
  fill_lanes();
}

void CoRunLoadBound::fill_lanes() {
  lanes_ = {};
  pairs_ = (count_ + 1) / 2;
  for (int k = 0; k < count_; ++k) {
    for (int s = 0; s < 3; ++s) {
      lanes_[static_cast<size_t>(k / 2)][static_cast<size_t>(s)][k % 2] =
          vertices_[static_cast<size_t>(k)][static_cast<size_t>(s)];
    }
  }
}

// Vertices of {lambda >= 0, row_S . lambda <= 1}: every choice of three tight constraints
// (rows or lambda_s = 0) that meet in a feasible point. Each vertex is scaled so that it
// is feasible in floating point too, with a margin, since an infeasible lambda could
// bound above the true time.
CoRunLoadBound::CoRunLoadBound(const RateMatrix& stream_pair_rate) {
  const std::vector<Vec3> rows = constraint_rows(stream_pair_rate);
  std::vector<Vec3> planes = rows;
  std::vector<double> rhs(rows.size(), 1.0);
  for (int s = 0; s < 3; ++s) {
    Vec3 unit{};
    unit[s] = 1;
    planes.push_back(unit);
    rhs.push_back(0.0);
  }
  std::vector<Vec3> found = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  const size_t n = planes.size();
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = a + 1; b < n; ++b) {
      for (size_t c = b + 1; c < n; ++c) {
        Vec3 x{};
        if (!intersect({planes[a], planes[b], planes[c]}, {rhs[a], rhs[b], rhs[c]}, &x)) continue;
        if (std::min({x[0], x[1], x[2]}) < -1e-9) continue;
        for (double& v : x) v = std::max(v, 0.0);
        double worst = 0;
        for (const Vec3& row : rows) worst = std::max(worst, dot(row, x));
        if (worst > 1 + 1e-9 || worst <= 0) continue;
        const double scale = (1 - 1e-12) / std::max(worst, 1.0);
        for (double& v : x) v *= scale;
        found.push_back(x);
      }
    }
  }
  // Keep vertices no other vertex dominates (loads are >= 0, so a dominated one never
  // gives the maximum), as many as fit. The unit vectors come first and stay: the others
  // are scaled below 1 in every entry, so none dominates a unit vector, and the bound is
  // never below the plain one.
  std::vector<Vec3> kept;
  for (size_t i = 0; i < found.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < found.size() && !dominated; ++j) {
      if (i == j) continue;
      const Vec3& p = found[i];
      const Vec3& q = found[j];
      const bool ge = q[0] >= p[0] && q[1] >= p[1] && q[2] >= p[2];
      const bool strictly = q[0] > p[0] || q[1] > p[1] || q[2] > p[2];
      dominated = ge && (strictly || j < i);  // among equal vectors keep the first
    }
    if (!dominated) kept.push_back(found[i]);
  }
  for (const Vec3& v : kept) {
    if (count_ < kMaxVertices) vertices_[static_cast<size_t>(count_++)] = v;
  }
  fill_lanes();
}

}  // namespace dhelix
