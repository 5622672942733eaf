#include "lib/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

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

int count_entries(const std::filesystem::path& directory) {
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(directory)) ++files;
  return files;
}

mode_t file_type(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_mode & S_IFMT;
}

std::string io_error_of(const std::function<void()>& write) {
  try {
    write();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    return error.what();
  }
  ADD_FAILURE() << "expected an Error";
  return "";
}

// Renaming over /dev/null made the device node a regular file (as root, for everyone).
TEST_F(AtomicFileTest, DevNullIsWrittenThroughNotReplaced) {
  write_file_atomically("/dev/null", "a plan nobody keeps");
  EXPECT_EQ(file_type("/dev/null"), static_cast<mode_t>(S_IFCHR));
}

TEST_F(AtomicFileTest, DevFullIsAnErrorAndStaysADevice) {
  const std::string message = io_error_of([] { write_file_atomically("/dev/full", "x"); });
  EXPECT_NE(message.find("/dev/full: cannot write file: writing: No space left on device"),
            std::string::npos)
      << message;
  EXPECT_EQ(file_type("/dev/full"), static_cast<mode_t>(S_IFCHR));
}

TEST_F(AtomicFileTest, FifoWithAReaderReceivesTheContent) {
  const std::string fifo = (directory_ / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] { received = read_all(fifo); });
  // The reader may not have opened its end yet: a FIFO without one is refused, so retry.
  for (int attempt = 0;; ++attempt) {
    try {
      write_file_atomically(fifo, "through the pipe");
      break;
    } catch (const Error& error) {
      ASSERT_LT(attempt, 5000) << error.what();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  reader.join();
  EXPECT_EQ(received, "through the pipe");
  EXPECT_EQ(file_type(fifo), static_cast<mode_t>(S_IFIFO));
}

TEST_F(AtomicFileTest, FifoWithoutAReaderIsRefusedNotWaitedFor) {
  const std::string fifo = (directory_ / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string message = io_error_of([&] { write_file_atomically(fifo, "x"); });
  EXPECT_NE(message.find("is a FIFO that no process is reading"), std::string::npos) << message;
  EXPECT_EQ(file_type(fifo), static_cast<mode_t>(S_IFIFO));
  EXPECT_EQ(count_entries(directory_), 1);
}

TEST_F(AtomicFileTest, DirectoryIsRefused) {
  const std::string message = io_error_of([&] { write_file_atomically(directory_.string(), "x"); });
  EXPECT_NE(message.find("is a directory, expected a file"), std::string::npos) << message;
  EXPECT_EQ(count_entries(directory_), 0);
  EXPECT_THROW(check_output_path(directory_.string()), Error);
  EXPECT_THROW(check_output_path((directory_ / "missing" / "plan.json").string()), Error);
  EXPECT_NO_THROW(check_output_path((directory_ / "plan.json").string()));
  EXPECT_NO_THROW(check_output_path("/dev/null"));
}

TEST_F(AtomicFileTest, SymbolicLinkStaysALink) {
  const auto target = directory_ / "real.json";
  const auto link = directory_ / "link.json";
  write_file_atomically(target.string(), "old");
  std::filesystem::create_symlink(target, link);
  write_file_atomically(link.string(), "new");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(read_all(target), "new");
}

// A plan written, then the trace failing, left the new plan beside the old trace.
TEST_F(AtomicFileTest, OutputsOfOneCommandFailTogether) {
  const auto plan = directory_ / "plan.json";
  const auto trace = directory_ / "trace.json";
  write_file_atomically(plan.string(), "old plan");
  write_file_atomically(trace.string(), "old trace");
  for (const std::string& bad : {std::string("/dev/full"), (plan / "x.svg").string()}) {
    OutputFiles files;
    files.add(plan.string(), "new plan");
    files.add(trace.string(), "new trace");
    files.add(bad, "picture");
    EXPECT_THROW(files.commit(), Error) << bad;
    EXPECT_EQ(read_all(plan), "old plan") << bad;
    EXPECT_EQ(read_all(trace), "old trace") << bad;
    EXPECT_EQ(count_entries(directory_), 2) << bad;  // no temporary file left
  }
  OutputFiles files;
  files.add(plan.string(), "new plan");
  files.add(trace.string(), "new trace");
  files.add("/dev/null", "picture");
  files.commit();
  EXPECT_EQ(read_all(plan), "new plan");
  EXPECT_EQ(read_all(trace), "new trace");
}

}  // namespace
}  // namespace dhelix
