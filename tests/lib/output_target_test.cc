// Outputs given where a file is expected, and inputs that are no regular file
// (lib/output_target.h, lib/append_file.h, lib/input_file.h): a dangling link is written
// through to where it points, a read-only file is refused, a FIFO never makes a tool wait.

#include "lib/output_target.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>

#include "lib/append_file.h"
#include "lib/atomic_file.h"
#include "lib/error.h"
#include "lib/input_file.h"

namespace dhelix {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

mode_t mode_of(const fs::path& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

std::string io_error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "expected an Error";
  return "";
}

class OutputTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dhelix_output_target_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  int count_files() const {
    int files = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_)) ++files;
    return files;
  }
  fs::path dir_;
};

// The link was replaced by a regular file and its target never written.
TEST_F(OutputTargetTest, DanglingLinkWritesItsTargetAndStays) {
  fs::create_directory(dir_ / "plans");
  fs::create_symlink("plans/plan.json", dir_ / "link.json");  // relative, dangling
  write_file_atomically((dir_ / "link.json").string(), "the plan");
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.json"));
  EXPECT_EQ(read_all(dir_ / "plans/plan.json"), "the plan");
  // A chain of dangling links ends at one file.
  fs::create_symlink(dir_ / "second", dir_ / "first");
  fs::create_symlink(dir_ / "end.json", dir_ / "second");
  write_file_atomically((dir_ / "first").string(), "chained");
  EXPECT_TRUE(fs::is_symlink(dir_ / "first"));
  EXPECT_TRUE(fs::is_symlink(dir_ / "second"));
  EXPECT_EQ(read_all(dir_ / "end.json"), "chained");
}

TEST_F(OutputTargetTest, DanglingLinkIntoAMissingFolderIsRefused) {
  fs::create_symlink(dir_ / "no/such/plan.json", dir_ / "link.json");
  const std::string message =
      io_error_of([&] { check_output_path((dir_ / "link.json").string()); });
  EXPECT_NE(message.find("no/such"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.json"));
}

TEST_F(OutputTargetTest, LinkLoopIsRefused) {
  fs::create_symlink(dir_ / "b", dir_ / "a");
  fs::create_symlink(dir_ / "a", dir_ / "b");
  const std::string message =
      io_error_of([&] { write_file_atomically((dir_ / "a").string(), "x"); });
  EXPECT_NE(message.find("symbolic link"), std::string::npos) << message;
}

// A 0444 file was replaced and became 0644 (root passes every access(2) check).
TEST_F(OutputTargetTest, ReadOnlyFileIsRefusedAndKept) {
  const fs::path file = dir_ / "plan.json";
  std::ofstream(file) << "old";
  fs::permissions(file, fs::perms(0444));
  const std::string message = io_error_of([&] { write_file_atomically(file.string(), "new"); });
  EXPECT_NE(message.find("plan.json: cannot write file: is read-only; dhelix does not overwrite "
                         "a file without write permission"),
            std::string::npos)
      << message;
  EXPECT_EQ(read_all(file), "old");
  EXPECT_EQ(mode_of(file), 0444u);
  // Through a link too, and by the check tools make before their work.
  fs::create_symlink(file, dir_ / "link.json");
  EXPECT_NE(io_error_of([&] {
              check_output_path((dir_ / "link.json").string());
            }).find("which is read-only"),
            std::string::npos);
  EXPECT_NE(io_error_of([&] { AppendFile().open(file.string()); }).find("is read-only"),
            std::string::npos);
  EXPECT_EQ(read_all(file), "old");
  EXPECT_EQ(count_files(), 2);  // no temporary file left
}

TEST_F(OutputTargetTest, ReplacedFileKeepsItsMode) {
  const fs::path file = dir_ / "plan.json";
  std::ofstream(file) << "old";
  fs::permissions(file, fs::perms(0600));
  write_file_atomically(file.string(), "new");
  EXPECT_EQ(read_all(file), "new");
  EXPECT_EQ(mode_of(file), 0600u);  // was 0644 (the umask's mode for a new file)
}

TEST_F(OutputTargetTest, AppendFileFollowsADanglingLink) {
  fs::create_symlink(dir_ / "losses.log", dir_ / "link.log");
  {
    AppendFile log;
    log.open((dir_ / "link.log").string());
    log.append("one\n");
    log.append("two\n");
  }
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.log"));
  EXPECT_EQ(read_all(dir_ / "losses.log"), "one\ntwo\n");
}

// std::ofstream waited in open(2) forever for a reader: dhelix-run --loss-log FIFO hung.
TEST_F(OutputTargetTest, AppendFileRefusesAFifoNobodyReads) {
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = io_error_of([&] { AppendFile().open(fifo.string()); });
  EXPECT_NE(message.find("is a FIFO that no process is reading"), std::string::npos) << message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST_F(OutputTargetTest, AppendFileRefusesADirectory) {
  EXPECT_NE(io_error_of([&] { AppendFile().open(dir_.string()); }).find("is a directory"),
            std::string::npos);
}

TEST_F(OutputTargetTest, InputsMustBeRegularFiles) {
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(io_error_of([&] { read_input_file(fifo.string()); }).find("is a FIFO (named pipe)"),
            std::string::npos);
  EXPECT_NE(io_error_of([&] { read_input_file("/dev/null"); }).find("is a character device"),
            std::string::npos);
  EXPECT_NE(io_error_of([&] { read_input_file(dir_.string()); }).find("is a directory"),
            std::string::npos);
  std::ofstream(dir_ / "job.json") << "{}";
  fs::create_symlink(dir_ / "job.json", dir_ / "link.json");
  EXPECT_EQ(read_input_file((dir_ / "link.json").string()), "{}");
}

}  // namespace
}  // namespace dhelix
