#include "lib/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "lib/error.h"

namespace dhelix {
namespace {

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::filesystem::temp_directory_path() /
                 ("dhelix_atomic_" + std::to_string(::getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }
  std::filesystem::path directory_;
};

TEST_F(AtomicFileTest, WritesAndReplacesContent) {
  const auto path = directory_ / "plan.json";
  write_file_atomically(path.string(), "first");
  EXPECT_EQ(read_all(path), "first");
  write_file_atomically(path.string(), "second, longer");
  EXPECT_EQ(read_all(path), "second, longer");
  // No temporary file is left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory_))
    ++files;
  EXPECT_EQ(files, 1);
}

TEST_F(AtomicFileTest, ModeFollowsTheUmask) {
  const auto path = directory_ / "plan.json";
  const mode_t saved = ::umask(027);
  write_file_atomically(path.string(), "x");
  ::umask(saved);
  struct stat info {};
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0640u);  // 0666 & ~027; a fixed 0644 ignored the umask
}

TEST_F(AtomicFileTest, FailureLeavesTheOldFileIntact) {
  const auto path = directory_ / "plan.json";
  write_file_atomically(path.string(), "old");
  // A read-only directory makes the temporary file impossible to create. Root ignores
  // permissions, so use a path whose parent is a regular file instead.
  const auto blocker = directory_ / "not_a_directory";
  write_file_atomically(blocker.string(), "x");
  try {
    write_file_atomically((blocker / "plan.json").string(), "new");
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(error.what()).find("not_a_directory/plan.json: cannot write file"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(read_all(path), "old");
}

}  // namespace
}  // namespace dhelix
