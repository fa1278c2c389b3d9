#include "mixtrain/core/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace MIXTRAIN_FILE_LOCAL {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "st-XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

  // A file assembled byte by byte from the format's definition, independent of the writer.
  void write_raw(const std::string& path, const std::string& header, const std::string& data) {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << data;
  }
  static std::string floats(std::initializer_list<float> values) {
    std::string bytes;
    for (float v : values) bytes.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return bytes;
  }
  void expect_error(const std::string& path, const std::string& fragment) {
    try {
      read_safetensors(path);
      FAIL() << "no error for " << fragment;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  }

  std::string dir_;
};

TEST_F(SafetensorsTest, ReadsAHandBuiltFile) {
  write_raw(
      file("a.safetensors"),
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      floats({1.0f, 2.0f, -3.5f}));
  SafetensorsContent c = read_safetensors(file("a.safetensors"));
  ASSERT_EQ(c.tensors.size(), 2u);
  EXPECT_EQ(c.tensors[0].first, "a");
  EXPECT_EQ(c.tensors[0].second[1].item<float>(), 2.0f);
  EXPECT_EQ(c.tensors[1].first, "b");
  EXPECT_EQ(c.tensors[1].second[0].item<float>(), -3.5f);
  EXPECT_EQ(c.metadata.at("format"), "pt");
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeBitForBit) {
  NamedTensors in;
  at::Tensor base = at::linspace(-3.3, 7.7, 24).reshape({2, 3, 4});
  for (auto dtype : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt,
                     at::kShort, at::kChar, at::kByte, at::kBool}) {
    in.emplace_back(safetensors_dtype_name(dtype), base.to(dtype));
  }
  in.emplace_back("scalar", at::scalar_tensor(4.25));
  in.emplace_back("empty", at::empty({0, 3}));
  in.emplace_back("strided", base.transpose(0, 2));  // non-contiguous input
  write_safetensors(file("r.safetensors"), in, {{"step", "7"}});
  SafetensorsContent out = read_safetensors(file("r.safetensors"));
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out.tensors[i].first, in[i].first);
    EXPECT_EQ(out.tensors[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_EQ(out.tensors[i].second.sizes(), in[i].second.sizes());
    EXPECT_TRUE(at::equal(out.tensors[i].second, in[i].second)) << in[i].first;
  }
  EXPECT_EQ(out.metadata.at("step"), "7");
  // The header length is a multiple of 8 so that the data section is aligned.
  std::ifstream raw(file("r.safetensors"), std::ios::binary);
  uint64_t n = 0;
  raw.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos);
  }
}

TEST_F(SafetensorsTest, MalformedFilesNameFileAndProblem) {
  write_raw(file("short"), "", "");
  std::ofstream(file("tiny"), std::ios::binary) << "abc";
  expect_error(file("tiny"), "8-byte");
  write_raw(file("json"), "{not json", "");
  expect_error(file("json"), "not JSON");
  write_raw(file("dtype"), R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", "x");
  expect_error(file("dtype"), "unsupported dtype");
  write_raw(file("size"), R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
            floats({1.0f}));
  expect_error(file("size"), "does not match");
  write_raw(file("past"), R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
            floats({1.0f}));
  expect_error(file("past"), "past the end");
  write_raw(file("hole"), R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            floats({1.0f, 2.0f}));
  expect_error(file("hole"), "hole");
  write_raw(file("trail"), R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
            floats({1.0f, 2.0f}));
  expect_error(file("trail"), "trailing");
  {
    std::ofstream out(file("header"), std::ios::binary);
    uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  expect_error(file("header"), "header length");
  try {
    read_safetensors(file("missing"));
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(file("missing")), std::string::npos);
  }
}

TEST_F(SafetensorsTest, WriteIntoMissingDirectoryFailsCleanly) {
  EXPECT_THROW(write_safetensors(file("no/such/dir/x.safetensors"), {{"a", at::ones({1})}}),
               UserError);
  EXPECT_THROW(write_safetensors(file("dup"), {{"a", at::ones({1})}, {"a", at::ones({1})}}),
               std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(file("dup")));
}

}  // namespace MIXTRAIN_FILE_LOCAL
}  // namespace mixtrain
