// The translation unit that builds the tests' precompiled header (test_pch.h, CMakeLists.txt).
